// How the elementwise kernels write outputs: whole 64-byte lines with
// streaming stores (the caller fences) or ordinary ones, the partial lines
// at either end touching only their elements. Include in files compiled
// per target, after hwy/highway.h.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_WRITER_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_WRITER_INL_H_
#undef NORMD_SERVER_CORE_SIMD_WRITER_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_WRITER_INL_H_
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "hwy/highway.h"
#include "server/core/simd/half-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// How far ahead of the element it writes a kernel prefetches its input:
// with a dozen operations a line, the hardware prefetcher falls behind.
inline constexpr int64_t kInputPrefetchBytes = 2048;

// What a writer prefetches as it writes element j: element j of `base`
// (elements of `element_bytes`) plus `ahead_bytes`, into L1, or into L2
// with `into_l2` (for data wanted later than the next few lines); nothing
// if base is null.
struct Prefetch {
  const char* base = nullptr;
  int64_t element_bytes = 0;
  int64_t ahead_bytes = 0;
  bool into_l2 = false;
};

// Writes out[0..n) from compute(j, count), the vector (tag d) of elements
// [j, j + count): count is the lane count but in the partial vectors at
// either end, where compute reads only `count` elements. Whole lines are
// streamed with kStream, `prefetch` read a line per line.
template <bool kStream, class D, typename T, class Compute>
HWY_INLINE void WriteVectors(D d, T* HWY_RESTRICT out, int64_t n,
                             const Compute& compute,
                             const Prefetch& prefetch = {}) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  const auto address = reinterpret_cast<uintptr_t>(out);
  // Whole lines from the first line boundary (a misaligned element never
  // reaches one: all partial), except for short cached outputs, which take
  // whole vectors from the start (no masked head and tail).
  const int64_t head =
      !kStream && n < 8 * kLine ? 0
      : address % sizeof(T) != 0
          ? n
          : std::min<int64_t>(
                n, static_cast<int64_t>((64 - address % 64) % 64 / sizeof(T)));
  auto partial = [&](int64_t from, int64_t to) NORMD_LAMBDA_INLINE {
    for (int64_t j = from; j < to; j += lanes) {
      const size_t count = static_cast<size_t>(std::min(lanes, to - j));
      if (count == static_cast<size_t>(lanes)) {
        hn::StoreU(compute(j, count), d, out + j);
      } else {
        StoreHead(d, compute(j, count), out + j, count);
      }
    }
  };
  partial(0, head);
  int64_t j = head;
  const int64_t line_bytes = kLine * prefetch.element_bytes;
  // The line loop, with or without prefetches (two loops: a test in the
  // loop costs the loop without them).
  // `locality`: __builtin_prefetch's, 0 for none.
  auto lines = [&](auto locality_constant) NORMD_LAMBDA_INLINE {
    constexpr int kLocality = decltype(locality_constant)::value;
    for (; j + kLine <= n; j += kLine) {
      if constexpr (kLocality != 0) {
        const char* ahead =
            prefetch.base + j * prefetch.element_bytes + prefetch.ahead_bytes;
        for (int64_t b = 0; b < line_bytes; b += 64) {
          __builtin_prefetch(ahead + b, 0, kLocality);
        }
      }
      for (int64_t k = 0; k < kLine; k += lanes) {
        const auto v = compute(j + k, static_cast<size_t>(lanes));
        if constexpr (kStream) {
          hn::Stream(v, d, out + j + k);
        } else {
          hn::StoreU(v, d, out + j + k);
        }
      }
    }
  };
  if (prefetch.base == nullptr) {
    lines(std::integral_constant<int, 0>());
  } else if (prefetch.into_l2) {
    lines(std::integral_constant<int, 2>());
  } else {
    lines(std::integral_constant<int, 3>());
  }
  partial(j, n);
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_WRITER_INL_H_

// How the elementwise kernels write their outputs, whatever they compute:
// a vector at a time, whole 64-byte lines with streaming stores (large
// outputs, which would only evict the cache; the caller fences with
// StreamFence) or ordinary ones, the partial lines at either end touching
// only their elements (tail-inl.h); and 16-bit outputs narrowed from fp32
// results in registers. Include inside a file compiled per target
// (foreach_target.h), after hwy/highway.h.

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
#include "server/core/tensor.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The fp32 vectors of the elementwise kernels: at most 16 lanes (a 64-byte
// line), so that a line is a whole number of vectors on every target.
using FloatVectorTag = hn::CappedTag<float, 16>;

// How far ahead of the element it writes a kernel prefetches its input
// (PrefetchedInput). With a dozen operations a line between the loads, the
// hardware prefetchers alone leave them waiting on DRAM (kernel_bench
// BM_HalfBatchNorm eval NCHW; 2 and 4 KiB ahead measure the same).
inline constexpr int64_t kInputPrefetchBytes = 2048;

// What a writer prefetches as it writes element j: the bytes of element j
// of `base` (elements of `element_bytes`), `ahead_bytes` further on. Null
// base: nothing.
struct Prefetch {
  const char* base = nullptr;
  int64_t element_bytes = 0;
  int64_t ahead_bytes = 0;
};

// Writes out[0..n) (n >= 0) from compute(j, count), the vector (tag d) of
// outputs of elements [j, j + count); count is the lane count but for the
// partial vectors at either end, where compute must read only `count`
// elements. The whole 64-byte lines of out go with streaming stores
// (kStream) or ordinary ones, `prefetch` read ahead a line per line.
template <bool kStream, class D, typename T, class Compute>
HWY_INLINE void WriteVectors(D d, T* HWY_RESTRICT out, int64_t n,
                             const Compute& compute,
                             const Prefetch& prefetch = {}) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  const auto address = reinterpret_cast<uintptr_t>(out);
  // A misaligned element never reaches a line boundary: all partial.
  const int64_t head =
      address % sizeof(T) != 0
          ? n
          : std::min<int64_t>(
                n, static_cast<int64_t>((64 - address % 64) % 64 / sizeof(T)));
  auto partial = [&](int64_t from, int64_t to) NORMD_LAMBDA_INLINE {
    for (int64_t j = from; j < to; j += lanes) {
      const size_t count = static_cast<size_t>(std::min(lanes, to - j));
      StoreHead(d, compute(j, count), out + j, count);
    }
  };
  partial(0, head);
  int64_t j = head;
  const int64_t line_bytes = kLine * prefetch.element_bytes;
  for (; j + kLine <= n; j += kLine) {
    if (prefetch.base != nullptr) {
      const char* ahead =
          prefetch.base + j * prefetch.element_bytes + prefetch.ahead_bytes;
      for (int64_t b = 0; b < line_bytes; b += 64) {
        __builtin_prefetch(ahead + b, 0, 3);
      }
    }
    for (int64_t k = 0; k < kLine; k += lanes) {
      const auto v = compute(j + k, static_cast<size_t>(lanes));
      if constexpr (kStream) {
        hn::Stream(v, d, out + j + k);
      } else {
        hn::Store(v, d, out + j + k);
      }
    }
  }
  partial(j, n);
}

// The element types of the elementwise kernels: kType's stored values, and
// the vectors they are computed in (fp64 for fp64, else fp32: 16-bit
// values are widened as loaded and narrowed as written).
template <DType kType>
struct Elements {
  static constexpr bool kHalf =
      kType == DType::kBFloat16 || kType == DType::kFloat16;
  using Stored = std::conditional_t<
      kType == DType::kFloat32, float,
      std::conditional_t<kType == DType::kFloat64, double, uint16_t>>;
  using Value = std::conditional_t<kType == DType::kFloat64, double, float>;
  using ValueTag = std::conditional_t<kType == DType::kFloat64,
                                      hn::CappedTag<double, 8>, FloatVectorTag>;
  // The output vectors: for 16-bit types two fp32 vectors' worth (one on
  // the scalar target, which has no pairs).
#if HWY_TARGET == HWY_SCALAR
  using OutTag =
      std::conditional_t<kHalf, hn::Rebind<uint16_t, ValueTag>, ValueTag>;
#else
  using OutTag =
      std::conditional_t<kHalf, hn::Repartition<uint16_t, ValueTag>, ValueTag>;
#endif

  // Elements [j, j + count) of x as values (count <= the value lanes).
  static HWY_INLINE hn::Vec<ValueTag> Load(const Stored* x, int64_t j,
                                           size_t count) {
    const ValueTag d;
    if constexpr (kHalf) {
      return WidenHalfBits<kType>(
          d, LoadPart(HalfBitsTag<ValueTag>(), x + j, count));
    } else {
      return LoadPart(d, x + j, count);
    }
  }

  // The output vector of elements [j, j + count) from results(j', count'),
  // the values of elements [j', j' + count') (count' may be 0), narrowed
  // for 16-bit types.
  template <class Results>
  static HWY_INLINE hn::Vec<OutTag> Output(int64_t j, size_t count,
                                           const Results& results) {
    if constexpr (!kHalf) {
      return results(j, count);
    } else {
      const ValueTag d;
#if HWY_TARGET == HWY_SCALAR
      return NarrowToHalfBits<kType>(d, results(j, count));
#else
      const size_t lanes = hn::Lanes(d);
      const size_t low = std::min(count, lanes);
      // In this order: results may keep a position that moves by little.
      const auto first = results(j, low);
      const auto second = results(j + static_cast<int64_t>(lanes), count - low);
      return NarrowPairToHalfBits<kType>(d, first, second);
#endif
    }
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_WRITER_INL_H_

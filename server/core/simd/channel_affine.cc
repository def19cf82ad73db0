// The channel affines (see channel_affine.h), compiled per target.
#include "server/core/simd/channel_affine.h"

#include <algorithm>
#include <cstdint>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/channel_affine.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/affine_store-inl.h"
#include "server/core/simd/ops-inl.h"
#include "server/core/simd/writer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// Runs of [kMinCursorRun, kMaxCursorRun) values are written line by line
// across channels (no partial stores at every run's ends), others run by
// run. The cursor is a specialization kept on measurement: AVX3 and AVX2,
// bench case ChannelAffine*/nchw49 (docs/design/kernels.md).
constexpr int64_t kMinCursorRun = 16;
constexpr int64_t kMaxCursorRun = 256;

// The channel affine of kType's elements [begin, end), streamed (kStream)
// or not.
template <DType kType, bool kStream>
void Range(const typename Elements<kType>::Stored* x,
           typename Elements<kType>::Stored* out, int64_t begin, int64_t end,
           int64_t channels, int64_t inner, int64_t period,
           const typename Elements<kType>::Value* a,
           const typename Elements<kType>::Value* b,
           const typename Elements<kType>::Value* c,
           const ChannelWrite& policy) {
  using E = Elements<kType>;
  using Stored = typename E::Stored;
  const typename E::ValueTag d;
  const typename E::OutTag dout;
  auto apply = [&](auto v, auto va, auto vb, auto vc) NORMD_LAMBDA_INLINE {
    if constexpr (kType == DType::kFloat64) {
      return hn::Add(hn::Mul(hn::Sub(v, va), vb), vc);
    } else {
      return FloatChannelAffine(d, v, va, vb, vc);
    }
  };
  // Writes out[from - begin, to - begin) from `value(j, count, v)`, the
  // results of the values v of elements [from + j, from + j + count).
  // kUniform: one channel's constants (value ignores j), so that whole
  // bfloat16 vectors are read in pair order (see EvenBFloat16).
  auto write = [&]<bool kUniform>(int64_t from, int64_t to,
                                  const auto& value) NORMD_LAMBDA_INLINE {
    const Stored* xs = x + (from - begin);
    const bool next = policy.prefetch_next_bytes > 0;
    const Prefetch prefetch{
        next || policy.prefetch_input ? reinterpret_cast<const char*>(xs)
                                      : nullptr,
        static_cast<int64_t>(sizeof(Stored)),
        next ? policy.prefetch_next_bytes : kInputPrefetchBytes, next};
    WriteVectors<kStream>(
        dout, out + (from - begin), to - from,
        [&](int64_t j, size_t count) NORMD_LAMBDA_INLINE {
#if HWY_TARGET != HWY_SCALAR
          if constexpr (kType == DType::kBFloat16) {
            if (kUniform && count == hn::Lanes(dout)) {
              const hn::RebindToUnsigned<decltype(d)> du32;
              const auto pairs =
                  hn::LoadU(du32, reinterpret_cast<const uint32_t*>(xs + j));
              return hn::BitCast(
                  dout, BFloat16Pairs(d, value(j, 0, EvenBFloat16(d, pairs)),
                                      value(j, 0, OddBFloat16(d, pairs))));
            }
          }
#endif
          return E::Output(j, count,
                           [&](int64_t k, size_t n) NORMD_LAMBDA_INLINE {
                             return value(k, n, E::Load(xs, k, n));
                           });
        },
        prefetch);
  };
  if (inner == 1) {
    // Per-element parameters: runs of at most `period`, each but the last
    // ending at a 64-byte line of out, so that streamed lines are whole.
    for (int64_t pos = begin; pos < end;) {
      const int64_t phase = pos % channels;
      int64_t run = std::min(period, end - pos);
      const auto run_end =
          reinterpret_cast<uintptr_t>(out + (pos - begin + run));
      if (pos + run < end && run_end % sizeof(Stored) == 0) {
        run -= std::min<int64_t>(
            run - 1, static_cast<int64_t>(run_end % 64 / sizeof(Stored)));
      }
      write.template operator()<false>(
          pos, pos + run,
          [&](int64_t j, size_t count, auto v) NORMD_LAMBDA_INLINE {
            return apply(v, LoadPart(d, a + phase + j, count),
                         LoadPart(d, b + phase + j, count),
                         LoadPart(d, c + phase + j, count));
          });
      pos += run;
    }
  } else if (inner >= kMinCursorRun && inner < kMaxCursorRun) {
    // Lines across runs: the constants of each vector's channel, blended
    // with the next channel's where its run ends within the vector. j moves
    // by a few vectors at a time (back too: a partial vector's empty second
    // half), without a division per vector.
    int64_t channel = (begin / inner) % channels;
    int64_t offset = begin % inner;
    int64_t at = 0;
    auto va = hn::Set(d, a[channel]);
    auto vb = hn::Set(d, b[channel]);
    auto vc = hn::Set(d, c[channel]);
    write.template operator()<false>(
        begin, end, [&](int64_t j, size_t count, auto v) NORMD_LAMBDA_INLINE {
          offset += j - at;
          at = j;
          if (offset >= inner || offset < 0) {
            for (; offset >= inner; offset -= inner) {
              channel = channel + 1 == channels ? 0 : channel + 1;
            }
            for (; offset < 0; offset += inner) {
              channel = channel == 0 ? channels - 1 : channel - 1;
            }
            va = hn::Set(d, a[channel]);
            vb = hn::Set(d, b[channel]);
            vc = hn::Set(d, c[channel]);
          }
          const int64_t left = inner - offset;
          if (left >= static_cast<int64_t>(count)) return apply(v, va, vb, vc);
          const int64_t next = channel + 1 == channels ? 0 : channel + 1;
          const auto here = hn::FirstN(d, static_cast<size_t>(left));
          return apply(v, hn::IfThenElse(here, va, hn::Set(d, a[next])),
                       hn::IfThenElse(here, vb, hn::Set(d, b[next])),
                       hn::IfThenElse(here, vc, hn::Set(d, c[next])));
        });
  } else {
    for (int64_t pos = begin; pos < end;) {
      const int64_t channel = (pos / inner) % channels;
      const int64_t run = std::min(inner - pos % inner, end - pos);
      const auto va = hn::Set(d, a[channel]);
      const auto vb = hn::Set(d, b[channel]);
      const auto vc = hn::Set(d, c[channel]);
      write.template operator()<true>(
          pos, pos + run, [&](int64_t, size_t, auto v) NORMD_LAMBDA_INLINE {
            return apply(v, va, vb, vc);
          });
      pos += run;
    }
  }
}

}  // namespace

void AnyRange(DType dtype, const void* x, void* out, int64_t begin, int64_t end,
              int64_t channels, int64_t inner, int64_t period, const void* a,
              const void* b, const void* c, const ChannelWrite& write) {
  ForDType(dtype, [&]<DType kType>() {
    using Stored = typename Elements<kType>::Stored;
    using Value = typename Elements<kType>::Value;
    auto range = write.stream ? &Range<kType, true> : &Range<kType, false>;
    range(static_cast<const Stored*>(x), static_cast<Stored*>(out), begin, end,
          channels, inner, period, static_cast<const Value*>(a),
          static_cast<const Value*>(b), static_cast<const Value*>(c), write);
  });
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(AnyRange);

void ChannelAffineWrite(DType dtype, const void* x, void* out, int64_t begin,
                        int64_t end, int64_t channels, int64_t inner,
                        int64_t period, const void* a, const void* b,
                        const void* c, const ChannelWrite& write) {
  HWY_DYNAMIC_DISPATCH(AnyRange)
  (dtype, x, out, begin, end, channels, inner, period, a, b, c, write);
}

}  // namespace normd
#endif  // HWY_ONCE

// The channel affines (see channel_affine.h), compiled per target.
#include "server/core/simd/channel_affine.h"

#include <algorithm>
#include <cstdint>
#include <numeric>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd/channel_affine.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"
#include "server/core/simd/ops-inl.h"
#include "server/core/simd/writer-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

// Runs of [kMinCursorRun, kMaxCursorRun) values are written line by line
// across channels (no partial stores at every run's ends), others run by
// run. The cursor is a specialization kept on measurement (AVX3 and AVX2,
// bench/HISTORY.md, "Specializations measured").
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
           const typename Elements<kType>::Value* c, bool prefetch_input) {
  using E = Elements<kType>;
  using Stored = typename E::Stored;
  const typename E::ValueTag d;
  const typename E::OutTag dout;
  auto apply = [&](auto v, auto va, auto vb, auto vc) NORMD_LAMBDA_INLINE {
    if constexpr (kType == DType::kFloat64) {
      return hn::Add(hn::Mul(hn::Sub(v, va), vb), vc);
    } else {
      return ExactMulAdd(d, hn::Sub(v, va), vb, vc);
    }
  };
#if HWY_TARGET != HWY_SCALAR
  // The output vector of the bfloat16 elements at xs in pair order (see
  // EvenBFloat16), with the constants of the even and the odd elements.
  auto pair_output = [&](const Stored* xs, auto ae, auto be, auto ce, auto ao,
                         auto bo, auto co) NORMD_LAMBDA_INLINE {
    const hn::RebindToUnsigned<hn::DFromV<decltype(ae)>> du32;
    const auto pairs = hn::LoadU(du32, reinterpret_cast<const uint32_t*>(xs));
    return hn::BitCast(
        dout, BFloat16Pairs(d, apply(EvenBFloat16(d, pairs), ae, be, ce),
                            apply(OddBFloat16(d, pairs), ao, bo, co)));
  };
#endif
  // Writes out[from - begin, to - begin) from `value(j, count, v)`, the
  // results of the values v of elements [from + j, from + j + count).
  auto write = [&](int64_t from, int64_t to,
                   const auto& value) NORMD_LAMBDA_INLINE {
    const Stored* xs = x + (from - begin);
    const Prefetch prefetch{
        prefetch_input ? reinterpret_cast<const char*>(xs) : nullptr,
        static_cast<int64_t>(sizeof(Stored)), kInputPrefetchBytes};
    WriteVectors<kStream>(
        dout, out + (from - begin), to - from,
        [&](int64_t j, size_t count) NORMD_LAMBDA_INLINE {
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
    auto per_element = [&](int64_t from, int64_t to) NORMD_LAMBDA_INLINE {
      for (int64_t pos = from; pos < to;) {
        const int64_t phase = pos % channels;
        int64_t run = std::min(period, to - pos);
        const auto run_end =
            reinterpret_cast<uintptr_t>(out + (pos - begin + run));
        if (pos + run < to && run_end % sizeof(Stored) == 0) {
          run -= std::min<int64_t>(
              run - 1, static_cast<int64_t>(run_end % 64 / sizeof(Stored)));
        }
        write(pos, pos + run,
              [&](int64_t j, size_t count, auto v) NORMD_LAMBDA_INLINE {
                return apply(v, LoadPart(d, a + phase + j, count),
                             LoadPart(d, b + phase + j, count),
                             LoadPart(d, c + phase + j, count));
              });
        pos += run;
      }
    };
    // Parameters that repeat within 4 vectors (lcm(channels, a line)
    // elements) are held in registers over the whole lines: the same
    // operations, without per-element loads. A specialization kept on
    // measurement (bench/HISTORY.md, "Specializations measured").
    const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
    constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(Stored));
    const int64_t repeat = std::lcm(channels, kLine);
    const auto address = reinterpret_cast<uintptr_t>(out);
    const int64_t head =
        static_cast<int64_t>((64 - address % 64) % 64 / sizeof(Stored));
    const int64_t whole = (end - begin - head) / repeat * repeat;
    if (repeat > 4 * lanes || repeat > period || address % sizeof(Stored) ||
        whole < 2 * repeat) {
      per_element(begin, end);
      return;
    }
    per_element(begin, begin + head);
    const int64_t from = begin + head;
    const int64_t vectors = repeat / lanes;
    const int64_t phase = from % channels;
    // Vector v of a repeat (vector 0 past `vectors`).
    auto held = [&](const auto* p, int64_t v) NORMD_LAMBDA_INLINE {
      return hn::LoadU(d, p + phase + (v < vectors ? v * lanes : 0));
    };
    const auto a0 = held(a, 0), a1 = held(a, 1), a2 = held(a, 2),
               a3 = held(a, 3);
    const auto b0 = held(b, 0), b1 = held(b, 1), b2 = held(b, 2),
               b3 = held(b, 3);
    const auto c0 = held(c, 0), c1 = held(c, 1), c2 = held(c, 2),
               c3 = held(c, 3);
    auto store = [&](auto v, Stored* to) NORMD_LAMBDA_INLINE {
      if constexpr (kStream) {
        hn::Stream(v, dout, to);
      } else {
        hn::Store(v, dout, to);
      }
    };
    auto prefetch_repeat = [&](int64_t j) NORMD_LAMBDA_INLINE {
      if (!prefetch_input) return;
      const char* ahead =
          reinterpret_cast<const char*>(x + j) + kInputPrefetchBytes;
      for (int64_t byte = 0; byte < repeat * int64_t{sizeof(Stored)};
           byte += 64) {
        __builtin_prefetch(ahead + byte, 0, 3);
      }
    };
#if HWY_TARGET != HWY_SCALAR
    if constexpr (kType == DType::kBFloat16) {
      // The constants of the even and the odd elements, put in pair order
      // once.
      auto even = [&](auto hi, auto lo) { return hn::ConcatEven(d, hi, lo); };
      auto odd = [&](auto hi, auto lo) { return hn::ConcatOdd(d, hi, lo); };
      const auto ae0 = even(a1, a0), be0 = even(b1, b0), ce0 = even(c1, c0);
      const auto ao0 = odd(a1, a0), bo0 = odd(b1, b0), co0 = odd(c1, c0);
      const auto ae1 = even(a3, a2), be1 = even(b3, b2), ce1 = even(c3, c2);
      const auto ao1 = odd(a3, a2), bo1 = odd(b3, b2), co1 = odd(c3, c2);
      for (int64_t j = from - begin; j < from - begin + whole; j += repeat) {
        prefetch_repeat(j);
        store(pair_output(x + j, ae0, be0, ce0, ao0, bo0, co0), out + j);
        if (vectors > 2) {
          store(pair_output(x + j + 2 * lanes, ae1, be1, ce1, ao1, bo1, co1),
                out + j + 2 * lanes);
        }
      }
      per_element(from + whole, end);
      return;
    }
#endif
    for (int64_t j = from - begin; j < from - begin + whole; j += repeat) {
      prefetch_repeat(j);
      // Vectors past `vectors` are not read (r0 stands in).
      const auto r0 = apply(E::Load(x, j, lanes), a0, b0, c0);
      const auto r1 =
          vectors > 1 ? apply(E::Load(x, j + lanes, lanes), a1, b1, c1) : r0;
      const auto r2 = vectors > 2
                          ? apply(E::Load(x, j + 2 * lanes, lanes), a2, b2, c2)
                          : r0;
      const auto r3 = vectors > 3
                          ? apply(E::Load(x, j + 3 * lanes, lanes), a3, b3, c3)
                          : r0;
      if constexpr (E::kHalf) {
#if HWY_TARGET != HWY_SCALAR
        store(NarrowPairToHalfBits<kType>(d, r0, r1), out + j);
        if (vectors > 2) {
          store(NarrowPairToHalfBits<kType>(d, r2, r3), out + j + 2 * lanes);
        }
#endif
      } else {
        store(r0, out + j);
        if (vectors > 1) store(r1, out + j + lanes);
        if (vectors > 2) store(r2, out + j + 2 * lanes);
        if (vectors > 3) store(r3, out + j + 3 * lanes);
      }
    }
    per_element(from + whole, end);
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
    write(begin, end, [&](int64_t j, size_t count, auto v) NORMD_LAMBDA_INLINE {
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
#if HWY_TARGET != HWY_SCALAR
      if constexpr (kType == DType::kBFloat16) {
        // One channel's constants: whole vectors in pair order.
        const Stored* xs = x + (pos - begin);
        WriteVectors<kStream>(
            dout, out + (pos - begin), run,
            [&](int64_t j, size_t count) NORMD_LAMBDA_INLINE {
              if (count != hn::Lanes(dout)) {
                return E::Output(j, count,
                                 [&](int64_t k, size_t n) NORMD_LAMBDA_INLINE {
                                   return apply(E::Load(xs, k, n), va, vb, vc);
                                 });
              }
              return pair_output(xs + j, va, vb, vc, va, vb, vc);
            },
            Prefetch{
                prefetch_input ? reinterpret_cast<const char*>(xs) : nullptr,
                static_cast<int64_t>(sizeof(Stored)), kInputPrefetchBytes});
        pos += run;
        continue;
      }
#endif
      write(pos, pos + run, [&](int64_t, size_t, auto v) NORMD_LAMBDA_INLINE {
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
          static_cast<const Value*>(b), static_cast<const Value*>(c),
          write.prefetch_input);
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

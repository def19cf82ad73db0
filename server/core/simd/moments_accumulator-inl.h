// The one moments accumulator, which every moments kernel instantiates:
// the sums of e = x - shift and e^2 in fixed logical lanes, over steps that
// each put one value in every lane. Its parameters are each kernel's
// choices:
// - the lanes: how many, their panel and type (D: fp32 or fp64, of any
//   width; a lane's additions do not depend on which vector holds it, so
//   the bits are the same on every target);
// - the flush interval (kFlushSteps): the steps summed before `flush` takes
//   the sums (into fp64, for fp32 lanes);
// - the shift rule: the lanes' shifts (SameShift, LaneShifts), or none
//   (LaneSums::kSums: a two-pass mean's first pass; kFusedGiven: load
//   gives e, the caller took the shift off);
// - e^2 rounded once (kFusedDeviations) or twice (kDeviations), and where
//   the sums start (StartFrom).
// The kernels: ExactMoments (8 fp64 lanes), ShortMoments (16 fp32 lanes),
// LongMoments (64 fp32 lanes flushed every 16 steps; block_moments.cc),
// ChannelsLastSums (a lane per channel, one call per 16-row interval),
// RunSums (16 fp64 lanes per run) and ExactChannelSums (channels-last: an
// fp64 lane per channel; else one lane continued run by run;
// channel_moments.cc). Include in files
// compiled per target, after hwy/highway.h. Pure functions.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_MOMENTS_ACCUMULATOR_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_MOMENTS_ACCUMULATOR_INL_H_
#undef NORMD_SERVER_CORE_SIMD_MOMENTS_ACCUMULATOR_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_MOMENTS_ACCUMULATOR_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// What one accumulation adds in each lane.
enum class LaneSums {
  kSums,             // dev += x (no shift; sq as it starts).
  kDeviations,       // dev += e, sq += e * e rounded, then added.
  kFusedDeviations,  // dev += e, sq += e * e rounded once (ExactMulAdd).
  kFusedGiven        // As kFusedDeviations, x already e (its shift taken off).
};

// The shift rules: one shift for every lane, or shift[lane] (lanes). Not
// vectors: SVE's are sizeless, and cannot be members.
template <typename T>
struct SameShift {
  static constexpr bool kSame = true;  // One register for the panel.
  T shift;
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D d, int64_t /*at*/) const {
    return hn::Set(d, shift);
  }
};
template <typename T>
SameShift(T) -> SameShift<T>;  // For clang before 17 (no aggregate CTAD).
template <typename T>
struct LaneShifts {
  static constexpr bool kSame = false;
  const T* shift;
  template <class D>
  HWY_INLINE hn::Vec<D> operator()(D d, int64_t at) const {
    return hn::LoadU(d, shift + at);
  }
};

// Every lane of every step holds a value.
struct EveryLane {
  int64_t operator()(int64_t /*step*/, int64_t /*at*/) const {
    return INT64_MAX;
  }
};

// No step past the whole ones.
struct NoPartialStep {
  static constexpr bool kPresent = false;
};

// One step past the whole ones, with values in its first `values` lanes:
// load(at) is the vector of lanes [at, at + vector lanes), read no further.
template <class Load>
struct PartialStep {
  static constexpr bool kPresent = true;
  int64_t values;
  Load load;
};
template <class Load>
PartialStep(int64_t, Load) -> PartialStep<Load>;

// The sums start from zero, or from what dev and sq hold: a running sum
// continued value by value (one lane, no flush).
enum class StartFrom { kZero, kSums };

// Adds the lanes of one step (kSums: x; else e = x - shift and e^2) to
// dev and sq, in the first `count` lanes (all when count >= the vector's).
template <LaneSums kAdd, class D, class V = hn::Vec<D>>
HWY_INLINE void AddLanes(D d, V x, V shift, V& dev, V& sq,
                         int64_t count = INT64_MAX) {
  const V e = kAdd == LaneSums::kSums || kAdd == LaneSums::kFusedGiven
                  ? x
                  : hn::Sub(x, shift);
  V square = sq;
  if constexpr (kAdd == LaneSums::kFusedDeviations ||
                kAdd == LaneSums::kFusedGiven) {
    square = ExactMulAdd(d, e, e, sq);
  } else if constexpr (kAdd == LaneSums::kDeviations) {
    square = hn::Add(sq, hn::Mul(e, e));
  }
  if (count >= static_cast<int64_t>(hn::Lanes(d))) {
    dev = hn::Add(dev, e);
    sq = square;
  } else if (count > 0) {
    const auto in = hn::FirstN(d, static_cast<size_t>(count));
    dev = hn::IfThenElse(in, hn::Add(dev, e), dev);
    sq = hn::IfThenElse(in, square, sq);
  }
}

// The accumulator. Lanes [0, lanes) (a multiple of kPanelLanes) in panels
// of kPanelLanes, whose 1, 2 or 4 vectors are independent chains in
// registers. For each interval of kFlushSteps steps (0: all `steps` at
// once), each panel sums the interval's steps in order: load(s, at, v),
// the vector of lanes [at, at + vector lanes) of step s (v: its place in
// the panel), its first count(s, at) lanes only; after the last step, the
// partial step (one interval only); then dev[p..p + n) and sq[p..p + n)
// hold the panel's sums for the interval and flush(first_step, p, n) is
// called, while they are still in L1 (kernels that need every panel act
// on the last).
template <LaneSums kAdd, int kPanelLanes, int64_t kFlushSteps = 0,
          StartFrom kStart = StartFrom::kZero, class D, class Shift, class Load,
          class Flush, class Count = EveryLane, class Partial = NoPartialStep>
HWY_INLINE void AccumulateMoments(D d, int64_t lanes, int64_t steps,
                                  const Shift& shift, const Load& load,
                                  hn::TFromD<D>* HWY_RESTRICT dev,
                                  hn::TFromD<D>* HWY_RESTRICT sq,
                                  const Flush& flush, const Count& count = {},
                                  const Partial& partial = {}) {
  static_assert(kFlushSteps == 0 || !Partial::kPresent,
                "a partial step ends the one interval");
  const int64_t width = static_cast<int64_t>(hn::Lanes(d));
  const int64_t vectors = kPanelLanes >= 4 * width   ? 4
                          : kPanelLanes >= 2 * width ? 2
                                                     : 1;
  auto interval = [&](int64_t first, int64_t end) NORMD_LAMBDA_INLINE {
    for (int64_t p = 0; p < lanes; p += vectors * width) {
      // Named vectors, not an array: SVE's vectors are sizeless.
      auto dev0 = hn::Zero(d), dev1 = dev0, dev2 = dev0, dev3 = dev0;
      auto sq0 = dev0, sq1 = dev0, sq2 = dev0, sq3 = dev0;
      auto shift0 = dev0, shift1 = dev0, shift2 = dev0, shift3 = dev0;
      // Each of the panel's vectors: f(v, dev_v, sq_v, shift_v).
      auto each = [&](const auto& f) NORMD_LAMBDA_INLINE {
        f(0, dev0, sq0, shift0);
        if (vectors > 1) f(1, dev1, sq1, shift1);
        if (vectors > 2) {
          f(2, dev2, sq2, shift2);
          f(3, dev3, sq3, shift3);
        }
      };
      each([&](int v, auto& dev_v, auto& sq_v, auto& shift_v)
               NORMD_LAMBDA_INLINE {
                 const int64_t at = p + v * width;
                 if constexpr (kStart == StartFrom::kSums) {
                   dev_v = hn::LoadU(d, dev + at);
                   sq_v = hn::LoadU(d, sq + at);
                 }
                 // Held in registers (GCC reloads them every step otherwise).
                 if constexpr (kAdd != LaneSums::kSums &&
                               kAdd != LaneSums::kFusedGiven) {
                   if (!Shift::kSame || v == 0) shift_v = shift(d, at);
                 }
               });
      // Vector v's shift: shift0 for them all when it is the same (AVX2's
      // 16 registers hold 4 dev, 4 sq and 1 shift, not 4).
      auto shift_of = [&](const auto& shift_v)
          NORMD_LAMBDA_INLINE -> const auto& {
        if constexpr (Shift::kSame) {
          return shift0;
        } else {
          return shift_v;
        }
      };
      for (int64_t s = first; s < end; ++s) {
        each([&](int v, auto& dev_v, auto& sq_v, const auto& shift_v)
                 NORMD_LAMBDA_INLINE {
                   const int64_t at = p + v * width;
                   AddLanes<kAdd>(d, load(s, at, v), shift_of(shift_v), dev_v,
                                  sq_v, count(s, at));
                 });
      }
      if constexpr (Partial::kPresent) {
        if (end == steps) {
          each([&](int v, auto& dev_v, auto& sq_v, const auto& shift_v)
                   NORMD_LAMBDA_INLINE {
                     const int64_t at = p + v * width;
                     if (at >= partial.values) return;
                     AddLanes<kAdd>(d, partial.load(at), shift_of(shift_v),
                                    dev_v, sq_v, partial.values - at);
                   });
        }
      }
      each([&](int v, auto& dev_v, auto& sq_v, auto&) NORMD_LAMBDA_INLINE {
        hn::StoreU(dev_v, d, dev + p + v * width);
        hn::StoreU(sq_v, d, sq + p + v * width);
      });
      flush(first, p, vectors * width);
    }
  };
  if constexpr (kFlushSteps == 0) {
    interval(0, steps);
  } else {
    for (int64_t first = 0; first < steps; first += kFlushSteps) {
      interval(first, std::min(steps, first + kFlushSteps));
    }
  }
}

// For accumulations whose caller reads dev and sq when it is done.
struct NoFlush {
  void operator()(int64_t /*first_step*/, int64_t /*p*/, int64_t /*n*/) const {}
};

// The accumulator over x[0..n) in turn, value i in lane i % kLanes, one
// shift: load(p, count) is the vector of the `count` values at p (a whole
// vector but in the last step), in D's type.
template <LaneSums kAdd, int kLanes, class D, typename T, class Load>
HWY_INLINE void AccumulateValues(D d, const T* HWY_RESTRICT x, int64_t n,
                                 hn::TFromD<D> shift, const Load& load,
                                 hn::TFromD<D>* HWY_RESTRICT dev,
                                 hn::TFromD<D>* HWY_RESTRICT sq) {
  const int64_t vector = static_cast<int64_t>(hn::Lanes(d));
  const int64_t whole = n / kLanes * kLanes;
  AccumulateMoments<kAdd, kLanes>(
      d, kLanes, n / kLanes, SameShift<hn::TFromD<D>>{shift},
      [&](int64_t s, int64_t at, int)
          NORMD_LAMBDA_INLINE { return load(x + s * kLanes + at, vector); },
      dev, sq, NoFlush(), EveryLane(),
      PartialStep{n - whole, [&](int64_t at) NORMD_LAMBDA_INLINE {
                    return load(x + whole + at,
                                std::min(vector, n - whole - at));
                  }});
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_MOMENTS_ACCUMULATOR_INL_H_

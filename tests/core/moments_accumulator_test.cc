// The moments accumulator (simd/moments_accumulator-inl.h) on each Highway
// target compiled in (HWY_EXPORT_AND_TEST_P): every lane's sums, bit for
// bit, against a scalar loop doing the additions its comment promises in
// the order it promises: each step in turn, each lane on its own, e = x -
// shift, e^2 rounded once (std::fma) or twice, the flushes after every
// interval, the partial step last. Lanes, flush interval, masks, start and
// shift rule all vary. Every moments kernel is this accumulator, so its
// same-bits promise rests on this.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tests/core/moments_accumulator_test.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

// After foreach_target.h.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "hwy/highway.h"
#include "hwy/tests/hwy_gtest.h"
#include "server/core/simd/moments_accumulator-inl.h"
#include "server/core/simd/ops-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

// The bit pattern of v. Not testing::Bits (tests/testing/reference.h):
// declaring normd::testing breaks HWY_BEFORE_TEST's unqualified testing::.
template <typename T>
uint64_t Bits(T v) {
  return sizeof(T) == 4 ? std::bit_cast<uint32_t>(static_cast<float>(v))
                        : std::bit_cast<uint64_t>(static_cast<double>(v));
}

// One accumulation's inputs: `whole` steps of `lanes` values, a partial
// step of `partial` values (0: none), the lanes' shifts, and how many
// lanes of each step hold values.
template <typename T>
struct Case {
  int64_t lanes;
  int64_t whole;
  int64_t flush_every;
  int64_t partial;
  bool masked;  // Step s has lanes - 3 (s % 3) values.
  std::vector<T> x;
  std::vector<T> shift;
  std::vector<T> start_dev, start_sq;  // The sums it starts from.

  int64_t Valid(int64_t s) const {
    return masked ? lanes - 3 * (s % 3) : lanes;
  }
};

template <typename T>
Case<T> MakeCase(int64_t lanes, int64_t whole, int64_t flush_every,
                 int64_t partial, bool masked, std::mt19937& gen) {
  Case<T> c{lanes, whole, flush_every, partial, masked, {}, {}, {}, {}};
  // Values around 1000 with a spread of 1, and shifts off by up to 2: the
  // sums' roundings differ with any change of order.
  std::uniform_real_distribution<double> value(999.0, 1001.0);
  std::uniform_real_distribution<double> off(-2.0, 2.0);
  c.x.resize((whole + 1) * lanes);
  for (T& v : c.x) v = static_cast<T>(value(gen));
  for (int64_t j = 0; j < lanes; ++j) {
    c.shift.push_back(static_cast<T>(1000.0 + off(gen)));
    c.start_dev.push_back(static_cast<T>(off(gen)));
    c.start_sq.push_back(static_cast<T>(off(gen) + 3.0));
  }
  return c;
}

// The sums the promise defines: each flush's copy of dev and sq, in order.
template <LaneSums kAdd, StartFrom kStart, typename T>
std::vector<T> Expected(const Case<T>& c) {
  std::vector<T> flushes;
  std::vector<T> dev(c.lanes), sq(c.lanes);
  const int64_t interval =
      c.flush_every > 0 ? c.flush_every : std::max<int64_t>(1, c.whole);
  for (int64_t first = 0; first < c.whole || (first == 0 && c.partial > 0);
       first += interval) {
    for (int64_t j = 0; j < c.lanes; ++j) {
      const bool from_sums = kStart == StartFrom::kSums;
      dev[j] = from_sums ? c.start_dev[j] : T(0);
      sq[j] = from_sums ? c.start_sq[j] : T(0);
    }
    auto add = [&](T x, int64_t j) {
      const T e = kAdd == LaneSums::kSums ? x : x - c.shift[j];
      dev[j] += e;
      if (kAdd == LaneSums::kFusedDeviations) sq[j] = std::fma(e, e, sq[j]);
      if (kAdd == LaneSums::kDeviations) sq[j] = sq[j] + e * e;
    };
    const int64_t end = std::min(c.whole, first + interval);
    for (int64_t s = first; s < end; ++s) {
      for (int64_t j = 0; j < c.Valid(s); ++j) add(c.x[s * c.lanes + j], j);
    }
    if (end == c.whole) {
      for (int64_t j = 0; j < c.partial; ++j) {
        add(c.x[c.whole * c.lanes + j], j);
      }
    }
    flushes.insert(flushes.end(), dev.begin(), dev.end());
    flushes.insert(flushes.end(), sq.begin(), sq.end());
  }
  return flushes;
}

// The accumulator's flushes on this target, with D of at most kLanes lanes.
template <LaneSums kAdd, StartFrom kStart, int kLanes, typename T>
std::vector<T> Accumulated(const Case<T>& c) {
  const hn::CappedTag<T, kLanes> d;
  const size_t vector_lanes = hn::Lanes(d);
  std::vector<T> dev = c.start_dev, sq = c.start_sq, flushes;
  auto load = [&](int64_t s, int64_t at, int) {
    return hn::LoadU(d, c.x.data() + s * c.lanes + at);
  };
  auto flush = [&](int64_t, int64_t p, int64_t panel) {
    if (p + panel < c.lanes) return;  // Once the interval is whole.
    flushes.insert(flushes.end(), dev.begin(), dev.end());
    flushes.insert(flushes.end(), sq.begin(), sq.end());
    if constexpr (kStart == StartFrom::kSums) {
      std::copy(c.start_dev.begin(), c.start_dev.end(), dev.begin());
      std::copy(c.start_sq.begin(), c.start_sq.end(), sq.begin());
    }
  };
  auto count = [&](int64_t s, int64_t at) { return c.Valid(s) - at; };
  const LaneShifts<T> shift{c.shift.data()};
  const T* last = c.x.data() + c.whole * c.lanes;
  const PartialStep partial{
      c.partial, [&](int64_t at) {
        return LoadPart(d, last + at,
                        std::min<size_t>(vector_lanes, c.partial - at));
      }};
  // The flush interval as the constant it is in the kernels.
  auto run = [&]<int64_t kFlush>() {
    constexpr int kPanel = std::min(kLanes, 64);
    if constexpr (kFlush == 0) {  // A partial step ends the one interval.
      if (c.partial > 0) {
        AccumulateMoments<kAdd, kPanel, kFlush, kStart>(
            d, c.lanes, c.whole, shift, load, dev.data(), sq.data(), flush,
            count, partial);
        return;
      }
    }
    if (c.masked) {
      AccumulateMoments<kAdd, kPanel, kFlush, kStart>(d, c.lanes, c.whole,
                                                      shift, load, dev.data(),
                                                      sq.data(), flush, count);
    } else {
      AccumulateMoments<kAdd, kPanel, kFlush, kStart>(
          d, c.lanes, c.whole, shift, load, dev.data(), sq.data(), flush);
    }
  };
  if (c.flush_every == 4) {
    run.template operator()<4>();
  } else if (c.flush_every == 16) {
    run.template operator()<16>();
  } else {
    run.template operator()<0>();
  }
  return flushes;
}

template <LaneSums kAdd, StartFrom kStart, int kLanes, typename T>
void CheckEveryShape(std::mt19937& gen) {
  for (int64_t whole : {0, 1, 5, 37}) {
    for (int64_t flush_every : {0, 4, 16}) {
      for (int64_t partial : {0, 1, kLanes - 1, kLanes / 2 + 1}) {
        for (bool masked : {false, true}) {
          if (whole == 0 && partial == 0) continue;
          // Starting from sums is for running sums: one interval.
          if (kStart == StartFrom::kSums && flush_every > 0) continue;
          if (masked && partial > 0) continue;
          if (flush_every > 0 && partial > 0) continue;
          if (masked && kLanes < 8) continue;
          const Case<T> c =
              MakeCase<T>(kLanes, whole, flush_every, partial, masked, gen);
          const std::vector<T> want = Expected<kAdd, kStart>(c);
          const std::vector<T> got = Accumulated<kAdd, kStart, kLanes>(c);
          ASSERT_EQ(got.size(), want.size());
          for (size_t i = 0; i < want.size(); ++i) {
            ASSERT_EQ(Bits(got[i]), Bits(want[i]))
                << "lanes " << kLanes << ", steps " << whole << ", flush "
                << flush_every << ", partial " << partial << ", masked "
                << masked << ": value " << i << " of " << want.size();
          }
        }
      }
    }
  }
}

void TestAccumulatorAddsEachLaneInStepOrder() {
  std::mt19937 gen(11);
  // The kernels' instantiations: 8 fp64 lanes (exact), 16 fp32 (short
  // rows), 16 fp64 (runs), 64 fp32 (blocks and tiles), 1 fp64 (the exact
  // channel loops, continuing running sums); and more lanes than a panel.
  CheckEveryShape<LaneSums::kSums, StartFrom::kZero, 8, double>(gen);
  CheckEveryShape<LaneSums::kDeviations, StartFrom::kZero, 8, double>(gen);
  CheckEveryShape<LaneSums::kSums, StartFrom::kZero, 16, float>(gen);
  CheckEveryShape<LaneSums::kFusedDeviations, StartFrom::kZero, 16, float>(gen);
  CheckEveryShape<LaneSums::kDeviations, StartFrom::kZero, 16, double>(gen);
  CheckEveryShape<LaneSums::kFusedDeviations, StartFrom::kZero, 64, float>(gen);
  CheckEveryShape<LaneSums::kFusedDeviations, StartFrom::kZero, 128, float>(
      gen);
  CheckEveryShape<LaneSums::kSums, StartFrom::kSums, 1, double>(gen);
  CheckEveryShape<LaneSums::kDeviations, StartFrom::kSums, 1, double>(gen);
}

}  // namespace
// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {
namespace {

HWY_BEFORE_TEST(MomentsAccumulatorTest);
HWY_EXPORT_AND_TEST_P(MomentsAccumulatorTest,
                      TestAccumulatorAddsEachLaneInStepOrder);

}  // namespace
}  // namespace normd
#endif  // HWY_ONCE

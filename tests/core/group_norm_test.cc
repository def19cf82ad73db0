// GroupNorm against the fp64 reference in every layout, a hand-worked
// example, PyTorch's one-value groups, and fused samples against one-sample
// runs.
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "server/core/engine.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/core_cases.h"

namespace normd {
namespace {

using ::normd::testing::CheckGroupNorm;
using ::normd::testing::DTypeOf;
using ::normd::testing::Fp32OutputBound;
using ::normd::testing::GroupCase;
using ::normd::testing::MaxAbsDiff;
using ::normd::testing::NumElementsOf;
using ::normd::testing::Param;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceGroupNorm;
using ::normd::testing::ResolvedAxis;
using ::normd::testing::View;

TEST(GroupNormTest, MatchesReferenceInEveryLayoutFloat32) {
  CheckGroupNorm<float>(NormMode::kGroupNorm);
}

TEST(GroupNormTest, MatchesReferenceInEveryLayoutFloat64) {
  CheckGroupNorm<double>(NormMode::kGroupNorm);
}

TEST(GroupNormTest, HandWorkedExample) {
  // [1, 4, 2], 2 groups: group 0 = channels 0-1 = {1, 3, 5, 7}: mean 4, var
  // 5; group 1 = {2, 2, 2, 2}: var 0, so its output is the bias alone.
  const std::vector<double> x = {1, 3, 5, 7, 2, 2, 2, 2};
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 2;
  spec.eps = 1e-12;
  spec.input = View(x, {1, 4, 2});
  spec.weight = Param({2, 1, 1, 1});
  spec.bias = Param({0, 10, 20, 30});
  std::vector<double> y(8);
  Engine engine;
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  const double s = 1 / std::sqrt(5.0 + 1e-12);
  const std::vector<double> expected = {
      2 * -3 * s, 2 * -1 * s, 10 + s, 10 + 3 * s, 20, 20, 30, 30};
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y[i], expected[i], 1e-12) << i;
}

TEST(GroupNormTest, OneValuePerGroupFollowsPyTorch) {
  // torch 1.13 refuses only a single sample of one value per group; with
  // more samples each group of one value normalizes to the bias.
  Engine engine;
  const std::vector<double> one = {1, 2, 3, 4};
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 4;
  spec.input = View(one, {1, 4});
  std::vector<double> y(8);
  auto refused = engine.Normalize(spec, y.data());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("input.shape"), std::string::npos);
  const std::vector<double> two = {1, 2, 3, 4, 5, 6, 7, 8};
  spec.input = View(two, {2, 4, 1, 1});
  spec.bias = Param({0.5, 1.5, 2.5, 3.5});
  ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
  for (int i = 0; i < 8; ++i) EXPECT_EQ(y[i], 0.5 + i % 4) << i;
  // InstanceNorm needs more than one spatial value.
  spec.mode = NormMode::kInstanceNorm;
  spec.num_groups = 0;
  EXPECT_EQ(engine.Normalize(spec, y.data()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GroupNormTest, EmptyBatchGivesEmptyOutput) {
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 2;
  const std::vector<float> none;
  spec.input = View(none, {0, 4, 3});
  EXPECT_TRUE(engine.Normalize(spec, nullptr).ok());
}

// Batches of several samples per thread run each sample's moments and then
// its output on one thread (FusedGroupSamples): channels-last with 64
// channels and streamed, sample n's output is written while sample n + 1's
// moments are read, in steps of 16 rows of the register tile (which rows
// counts not a multiple of 16 leave to the end, and which a block's
// exact-path redo does not step; the test lowers the sample size from
// which this happens); else written backwards. A batch of one sample takes
// the two-pass path. Each sample of a batch must come out with the bits it
// gets alone, on 1 or 2 threads, streamed or not, channels-last
// (parameters in registers or not; one tile, two, or one and 32 channels)
// or with the channel axis in the middle.
template <typename T>
void CheckFusedSamplesMatchOneSampleRuns() {
  struct Case {
    NormMode mode;
    GroupCase shape;
    // The first 32 rows of every sample shifted by 5e3: the tiles' shift
    // (the mean of those rows) is then far from the sample's mean, and the
    // blocks are redone exactly.
    bool shifted_head = false;
  };
  const Case cases[] = {
      {NormMode::kGroupNorm, {{6, 40, 33, 64}, -1, 16}},
      {NormMode::kInstanceNorm, {{5, 20, 21, 24}, -1, 0}},
      {NormMode::kGroupNorm, {{4, 30, 17, 10}, -1, 5}},
      {NormMode::kGroupNorm, {{4, 3, 6, 500}, 2, 3}},
      {NormMode::kGroupNorm, {{9, 20, 11, 64}, -1, 8}},    // 220 rows.
      {NormMode::kInstanceNorm, {{5, 7, 9, 128}, -1, 0}},  // Two tiles.
      {NormMode::kGroupNorm, {{6, 5, 13, 96}, -1, 32}},    // A tile and 32.
      {NormMode::kGroupNorm, {{8, 32, 32, 64}, -1, 4}, true},
  };
  for (const int threads : {1, 2}) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                              threads);
    for (const Case& c : cases) {
      const Shape& shape = c.shape.shape;
      const int64_t channels = shape[ResolvedAxis(c.shape)];
      const int64_t n = NumElementsOf(shape);
      const int64_t sample = n / shape[0];
      auto x = RandomValues<T>(n, 9, 1e3, 5.0);
      if (c.shifted_head) {
        for (int64_t i = 0; i < n; ++i) {
          if (i % sample < 32 * channels) x[i] += 5e3;
        }
      }
      std::vector<double> w(channels), b(channels);
      for (int64_t ch = 0; ch < channels; ++ch) {
        w[ch] = 0.75 + 0.01 * static_cast<double>(ch);
        b[ch] = 0.5 - 0.02 * static_cast<double>(ch);
      }
      for (int64_t threshold : {int64_t{0}, kDefaultStreamingOutputBytes}) {
        SCOPED_TRACE(::testing::Message()
                     << "mode " << static_cast<int>(c.mode) << " C " << channels
                     << " streamed " << (threshold == 0) << " threads "
                     << threads);
        SetStreamingOutputBytes(threshold);
        Engine engine;
        auto run = [&](const T* input, Shape s, T* y) {
          NormalizeSpec spec;
          spec.mode = c.mode;
          spec.num_groups = c.shape.groups;
          spec.channel_axis = c.shape.axis;
          const int64_t size = NumElementsOf(s);
          spec.input = InputTensor{DTypeOf<T>(), std::move(s), input, size};
          spec.weight = Param(w);
          spec.bias = Param(b);
          spec.eps = 1e-3;
          EXPECT_TRUE(engine.Normalize(spec, y).ok());
        };
        std::vector<T> batch(n), alone(n);
        run(x.data(), shape, batch.data());
        Shape one = shape;
        one[0] = 1;
        for (int64_t i = 0; i < shape[0]; ++i) {
          run(x.data() + i * sample, one, alone.data() + i * sample);
        }
        EXPECT_EQ(std::memcmp(batch.data(), alone.data(), n * sizeof(T)), 0);
        // And the values are GroupNorm's (the fp64 reference).
        const int64_t groups =
            c.mode == NormMode::kGroupNorm ? c.shape.groups : channels;
        const auto ref = ReferenceGroupNorm(x, shape, ResolvedAxis(c.shape),
                                            groups, 1e-3, w, b);
        // fp32: the row kernels' bound (the same moments and fused affine),
        // reference.h's Fp32OutputBound, at the largest |y|, |b| and |w|;
        // fp64: the fp64 bar.
        double largest_y = 0;
        for (double v : ref) largest_y = std::max(largest_y, std::abs(v));
        const double largest_b =
            std::max(std::abs(b.front()), std::abs(b.back()));
        const double tolerance =
            std::is_same_v<T, float>
                ? Fp32OutputBound(largest_y + largest_b, 0.0, w.back())
                : 1e-12;
        EXPECT_LE(MaxAbsDiff(batch, ref), tolerance);
      }
      SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
    }
  }
}

TEST(GroupNormTest, BatchesEqualOneSampleRunsBitwise) {
  CheckFusedSamplesMatchOneSampleRuns<float>();
  CheckFusedSamplesMatchOneSampleRuns<double>();
}

}  // namespace
}  // namespace normd

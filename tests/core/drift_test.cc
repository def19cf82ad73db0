// Drift monitoring in the core: the measures against the formulas worked by
// hand, the window's buckets and expiry on a hand-moved clock, sampling,
// and the Engine's observation of eval, training and Fit inputs in every
// dtype and layout against a long-double reference over the union of the
// observed tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "server/core/drift_measures.h"
#include "server/core/drift_monitor.h"
#include "server/core/drift_window.h"
#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/model_store.h"
#include "tests/testing/reference.h"

namespace normd {
namespace {

using testing::RandomValues;
using testing::RelErr;

constexpr int64_t kSecond = 1'000'000'000;

Moments MomentsOf(const std::vector<double>& values) {
  long double sum = 0;
  for (double v : values) sum += v;
  const long double mean = sum / values.size();
  long double m2 = 0;
  for (double v : values) m2 += (v - mean) * (v - mean);
  return {.count = static_cast<int64_t>(values.size()),
          .mean = static_cast<double>(mean),
          .m2 = static_cast<double>(m2)};
}

DriftReference Reference(std::vector<double> mean, std::vector<double> var) {
  return {.source = ReferenceSource::kExplicit,
          .set_unix_nanos = 7,
          .mean = std::move(mean),
          .var = std::move(var)};
}

TEST(DriftMeasuresTest, MatchTheFormulasWorkedByHand) {
  // Channel 0: values {1, 3} against N(0, 1): mw = 2, vw = 1, a = b = 1 +
  // eps, so kl = 0.5 * 4 * 2 / (1 + eps) and shift = 2 / sqrt(1 + eps).
  // Channel 1: values {5, 5} against N(5, 4): mw = mr, vw = 0, a = eps, b =
  // 4 + eps, kl = 0.5 (a/b + b/a - 2).
  const double eps = 1e-5;
  const DriftReport report = MeasureDrift(
      Reference({0, 5}, {1, 4}), {MomentsOf({1, 3}), MomentsOf({5, 5})}, eps,
      {.min_samples = 2, .threshold = 0.1});
  ASSERT_TRUE(report.measures.has_value());
  const DriftMeasures& m = *report.measures;
  const double kl0 = 4 / (1 + eps);
  const double a1 = eps, b1 = 4 + eps;
  const double kl1 = 0.5 * (a1 / b1 + b1 / a1 - 2);
  EXPECT_LT(RelErr(m.kl[0], kl0), 1e-15);
  EXPECT_LT(RelErr(m.kl[1], kl1), 1e-15);
  EXPECT_LT(RelErr(m.shift[0], 2 / std::sqrt(1 + eps)), 1e-15);
  EXPECT_EQ(m.shift[1], 0.0);
  EXPECT_EQ(m.kl_max, std::max(kl0, kl1));
  EXPECT_LT(RelErr(m.kl_mean, (kl0 + kl1) / 2), 1e-15);
  EXPECT_EQ(m.shift_max, m.shift[0]);
  EXPECT_EQ(m.channels_drifted, 2);
  EXPECT_EQ(report.window_samples, 2);
  EXPECT_EQ(report.reference_source, ReferenceSource::kExplicit);
  EXPECT_EQ(report.reference_set_unix_nanos, 7);
}

TEST(DriftMeasuresTest, IdenticalDistributionsHaveZeroDrift) {
  const Moments window = MomentsOf({-1, 1, -1, 1});  // Mean 0, var 1.
  const DriftReport report =
      MeasureDrift(Reference({0}, {1}), {window}, 1e-5, {.min_samples = 4});
  ASSERT_TRUE(report.measures.has_value());
  EXPECT_EQ(report.measures->kl[0], 0.0);
  EXPECT_EQ(report.measures->channels_drifted, 0);
}

TEST(DriftMeasuresTest, ThresholdCountsOnlyChannelsAboveIt) {
  // kl of channel c is 0.5 d^2 (2 / (1 + eps)) for a mean shift d.
  std::vector<Moments> window;
  for (double d : {0.1, 0.3, 0.5, 1.0})
    window.push_back(MomentsOf({d - 1, d + 1}));
  const DriftReport report =
      MeasureDrift(Reference({0, 0, 0, 0}, {1, 1, 1, 1}), window, 1e-5,
                   {.min_samples = 2, .threshold = 0.2});
  ASSERT_TRUE(report.measures.has_value());
  EXPECT_EQ(report.measures->channels_drifted, 2);  // 0.25 and 1.0.
}

TEST(DriftMeasuresTest, AbsentBelowTheMinimumSampleCount) {
  const DriftReport report =
      MeasureDrift(Reference({0}, {1}), {MomentsOf({1, 2, 3})}, 1e-5,
                   {.buckets = 4, .bucket_seconds = 30, .min_samples = 4});
  EXPECT_FALSE(report.measures.has_value());
  EXPECT_EQ(report.window_samples, 3);
  EXPECT_EQ(report.window_seconds, 120);
}

TEST(DriftWindowTest, OldBucketsExpireOneAtATime) {
  DriftWindow window(/*channels=*/1, /*buckets=*/3, /*bucket_seconds=*/10);
  window.Add({MomentsOf({1, 2})}, 0);
  window.Add({MomentsOf({10})}, 15 * kSecond);
  window.Add({MomentsOf({20, 30})}, 29 * kSecond);
  // At 29 s the buckets [0, 10), [10, 20), [20, 30) are all live.
  Moments all = window.Merged(29 * kSecond)[0];
  const Moments expected = MomentsOf({1, 2, 10, 20, 30});
  EXPECT_EQ(all.count, 5);
  EXPECT_LT(RelErr(all.mean, expected.mean), 1e-15);
  EXPECT_LT(RelErr(all.m2, expected.m2), 1e-14);
  // At 30 s the first has expired.
  all = window.Merged(30 * kSecond)[0];
  EXPECT_EQ(all.count, 3);
  EXPECT_LT(RelErr(all.mean, MomentsOf({10, 20, 30}).mean), 1e-15);
  // A new observation at 31 s takes the expired bucket's slot.
  window.Add({MomentsOf({40})}, 31 * kSecond);
  EXPECT_EQ(window.Merged(31 * kSecond)[0].count, 4);
  // Long after, nothing is left.
  EXPECT_EQ(window.Merged(1000 * kSecond)[0].count, 0);
}

TEST(DriftWindowTest, MergesEveryObservationOfABucket) {
  DriftWindow window(/*channels=*/2, /*buckets=*/10, /*bucket_seconds=*/60);
  std::vector<double> a, b;
  for (int i = 0; i < 20; ++i) {
    const std::vector<double> x = RandomValues<double>(8, i, 3.0 * i, 1.0);
    const std::vector<double> y = RandomValues<double>(8, 100 + i, -1.0, 2.0);
    window.Add({MomentsOf(x), MomentsOf(y)}, i * kSecond);
    a.insert(a.end(), x.begin(), x.end());
    b.insert(b.end(), y.begin(), y.end());
  }
  const std::vector<Moments> merged = window.Merged(20 * kSecond);
  for (const auto& [got, values] :
       {std::pair{merged[0], a}, std::pair{merged[1], b}}) {
    const Moments want = MomentsOf(values);
    EXPECT_EQ(got.count, want.count);
    EXPECT_LT(RelErr(got.mean, want.mean), 1e-14);
    EXPECT_LT(RelErr(got.m2, want.m2), 1e-13);
  }
}

TEST(DriftMonitorTest, ObservesEveryNthRequestOfEachModel) {
  DriftMonitor monitor({.sample_every = 3}, [] { return int64_t{0}; });
  std::vector<int> observed;
  for (int i = 0; i < 7; ++i) {
    if (monitor.ShouldObserve("a")) observed.push_back(i);
  }
  EXPECT_EQ(observed, (std::vector<int>{0, 3, 6}));
  EXPECT_TRUE(monitor.ShouldObserve("b"));  // Counted per model.
}

TEST(DriftMonitorTest, ClearEmptiesAndForgetDropsTheWindow) {
  int64_t now = 0;
  DriftMonitor monitor({}, [&] { return now; });
  monitor.Observe("m", {MomentsOf({1, 2})});
  EXPECT_EQ(monitor.Window("m", 1)[0].count, 2);
  monitor.Clear("m");
  EXPECT_EQ(monitor.Window("m", 1)[0].count, 0);
  monitor.Observe("m", {MomentsOf({1, 2, 3})});
  // Another channel count is another model's window: it starts over.
  monitor.Observe("m", {MomentsOf({1}), MomentsOf({2})});
  EXPECT_EQ(monitor.Window("m", 1)[0].count, 0);
  EXPECT_EQ(monitor.Window("m", 2)[1].count, 1);
  monitor.Forget("m");
  EXPECT_EQ(monitor.Window("m", 2)[1].count, 0);
}

// The engine's observations, one dtype and layout at a time.
struct Layout {
  const char* name;
  Shape shape;
  int32_t axis;
};

class EngineDriftTest : public ::testing::TestWithParam<DType> {
 protected:
  static constexpr int64_t kChannels = 3;

  // Values of every element, as the engine reads them (16-bit: rounded).
  std::vector<double> Rounded(const std::vector<double>& values) const {
    std::vector<double> out;
    for (double v : values) {
      switch (GetParam()) {
        case DType::kFloat32:
          out.push_back(static_cast<float>(v));
          break;
        case DType::kFloat64:
          out.push_back(v);
          break;
        default:
          out.push_back(HalfToFloat(
              GetParam(), FloatToHalf(GetParam(), static_cast<float>(v))));
      }
    }
    return out;
  }

  // `values` encoded in the dtype, in `bytes`.
  InputTensor Encode(const std::vector<double>& values, const Shape& shape,
                     std::vector<char>& bytes) const {
    const DType dtype = GetParam();
    bytes.resize(values.size() * ElementSize(dtype));
    for (size_t i = 0; i < values.size(); ++i) {
      char* at = bytes.data() + i * ElementSize(dtype);
      if (dtype == DType::kFloat32) {
        reinterpret_cast<float*>(at)[0] = static_cast<float>(values[i]);
      } else if (dtype == DType::kFloat64) {
        reinterpret_cast<double*>(at)[0] = values[i];
      } else {
        reinterpret_cast<uint16_t*>(at)[0] =
            FloatToHalf(dtype, static_cast<float>(values[i]));
      }
    }
    return {.dtype = dtype,
            .shape = shape,
            .data = bytes.data(),
            .size = static_cast<int64_t>(values.size())};
  }
};

TEST_P(EngineDriftTest, WindowHoldsTheMomentsOfEveryObservedInput) {
  for (const Layout& layout : {Layout{"nchw", {4, kChannels, 5, 7}, 1},
                               Layout{"nhwc", {4, 5, 7, kChannels}, -1},
                               Layout{"nc", {33, kChannels}, 1}}) {
    SCOPED_TRACE(layout.name);
    Engine engine({}, kDefaultMaxRank, {.min_samples = 1});
    ASSERT_TRUE(
        engine.store().Create({.name = "m", .num_features = kChannels}).ok());
    ASSERT_TRUE(engine.store()
                    .SetReference("m", {.source = ReferenceSource::kRunning})
                    .ok());
    // Per channel, every value observed, in long double.
    std::vector<std::vector<double>> seen(kChannels);
    const ChannelLayout channels =
        *ResolveChannelAxis(layout.shape, layout.axis);
    int64_t n = 1;
    for (int64_t d : layout.shape) n *= d;
    for (int step = 0; step < 3; ++step) {
      const std::vector<double> values =
          Rounded(RandomValues<double>(n, 10 * step, 2.0 + step, 1.5));
      std::vector<char> bytes;
      const InputTensor input = Encode(values, layout.shape, bytes);
      std::vector<char> output(bytes.size() + 64);
      if (step == 0) {  // Eval.
        NormalizeSpec spec{.mode = NormMode::kBatchNorm,
                           .model = "m",
                           .input = input,
                           .channel_axis = layout.axis};
        ASSERT_TRUE(engine.Normalize(spec, output.data()).ok());
      } else if (step == 1) {  // Training.
        NormalizeSpec spec{.mode = NormMode::kBatchNorm,
                           .model = "m",
                           .input = input,
                           .training = true,
                           .channel_axis = layout.axis};
        ASSERT_TRUE(engine.Normalize(spec, output.data()).ok());
      } else {
        ASSERT_TRUE(
            engine
                .Fit(
                    {.model = "m", .input = input, .channel_axis = layout.axis})
                .ok());
      }
      for (int64_t o = 0; o < channels.outer; ++o) {
        for (int64_t c = 0; c < kChannels; ++c) {
          for (int64_t i = 0; i < channels.inner; ++i) {
            seen[c].push_back(values[(o * kChannels + c) * channels.inner + i]);
          }
        }
      }
    }
    const BatchNormModel model = *engine.store().Get("m");
    const std::vector<Moments> window =
        engine.drift_monitor().Window("m", kChannels);
    const std::optional<DriftReport> report = engine.Drift(model);
    ASSERT_TRUE(report.has_value());
    ASSERT_TRUE(report->measures.has_value());
    // The core's accuracy bar for statistics (numerics.md): relative 1e-7
    // for fp32 and 16-bit data, 1e-12 for fp64.
    const double bar = GetParam() == DType::kFloat64 ? 1e-12 : 1e-7;
    for (int64_t c = 0; c < kChannels; ++c) {
      const Moments want = MomentsOf(seen[c]);
      EXPECT_EQ(window[c].count, want.count);
      EXPECT_LT(RelErr(window[c].mean, want.mean), bar) << c;
      EXPECT_LT(RelErr(window[c].m2, want.m2), bar) << c;
      // The measures of that window against the model's reference (its
      // running statistics when it was set: 0 and 1), by the formula.
      const double mw = window[c].mean;
      const double a = window[c].m2 / window[c].count + model.eps;
      const double b = 1 + model.eps;
      const double kl =
          0.5 * (a / b + b / a - 2) + 0.5 * mw * mw * (1 / a + 1 / b);
      EXPECT_LT(RelErr(report->measures->kl[c], kl), 1e-14) << c;
      EXPECT_LT(RelErr(report->measures->shift[c], std::abs(mw) / std::sqrt(b)),
                1e-15)
          << c;
    }
    EXPECT_EQ(report->window_samples, 3 * channels.outer * channels.inner);
  }
}

TEST_P(EngineDriftTest,
       ModelsWithoutAReferenceAndNonFiniteInputsAreNotObserved) {
  Engine engine({}, kDefaultMaxRank, {.min_samples = 1});
  ASSERT_TRUE(
      engine.store().Create({.name = "m", .num_features = kChannels}).ok());
  std::vector<double> values = RandomValues<double>(6 * kChannels, 1);
  std::vector<char> bytes;
  InputTensor input = Encode(values, {6, kChannels}, bytes);
  std::vector<char> output(bytes.size() + 64);
  NormalizeSpec spec{
      .mode = NormMode::kBatchNorm, .model = "m", .input = input};
  ASSERT_TRUE(engine.Normalize(spec, output.data()).ok());
  EXPECT_EQ(engine.drift_monitor().Window("m", kChannels)[0].count, 0);
  EXPECT_FALSE(engine.Drift(*engine.store().Get("m")).has_value());

  ASSERT_TRUE(engine.store()
                  .SetReference("m", {.source = ReferenceSource::kRunning})
                  .ok());
  values[4] = std::nan("");
  input = Encode(values, {6, kChannels}, bytes);
  spec.input = input;
  ASSERT_TRUE(engine.Normalize(spec, output.data()).ok());
  EXPECT_EQ(engine.drift_monitor().Window("m", kChannels)[0].count, 0);
}

INSTANTIATE_TEST_SUITE_P(EveryDType, EngineDriftTest,
                         ::testing::Values(DType::kFloat32, DType::kFloat64,
                                           DType::kBFloat16, DType::kFloat16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

}  // namespace
}  // namespace normd

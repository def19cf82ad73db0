// The same bits on every SIMD target (docs/api.md, numerics): the same
// random tensors, in every mode, dtype and layout, with odd tails, an
// offset of 1e4, and rows and channels holding NaN and Inf, go through the
// engine once per target compiled in and run by this CPU (and once more
// with streaming stores forced); every output byte and every fitted or
// updated model statistic must equal the first target's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/input_view.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::RandomValues;
using ::normd::testing::View;

// One tensor in every dtype: fp64 values rounded to each.
struct Tensor {
  Shape shape;
  std::vector<double> f64;
  std::vector<float> f32;
  std::vector<uint16_t> bf16, f16;

  // `special`: a NaN and an Inf, in different rows and channels (Fit and
  // training refuse them).
  Tensor(Shape s, uint32_t seed, double offset, bool special = true)
      : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    f64 = RandomValues<double>(n, seed, offset, 2.0);
    if (special) {
      f64[n / 3] = std::numeric_limits<double>::quiet_NaN();
      f64[2 * n / 3 + 1] = -std::numeric_limits<double>::infinity();
    }
    for (double v : f64) {
      f32.push_back(static_cast<float>(v));
      bf16.push_back(DoubleToHalf(DType::kBFloat16, v));
      // float16 tops out at 65504: the offset scaled down.
      f16.push_back(DoubleToHalf(DType::kFloat16, offset > 100 ? v / 8 : v));
    }
  }

  InputTensor Input(DType dtype) const {
    switch (dtype) {
      case DType::kFloat64:
        return View(f64, shape);
      case DType::kFloat32:
        return View(f32, shape);
      case DType::kBFloat16:
        return View(bf16, shape, DType::kBFloat16);
      default:
        return View(f16, shape, DType::kFloat16);
    }
  }
};

int64_t ElementBytes(DType dtype) {
  return dtype == DType::kFloat64 ? 8 : dtype == DType::kFloat32 ? 4 : 2;
}

std::string Bits(const std::vector<double>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(double));
}

// Every case through one Engine; the bytes of all outputs and models.
std::vector<std::string> RunAll() {
  std::vector<std::string> results;
  const Tensor rows(Shape{7, 5, 37}, 1, 0.5);
  const Tensor far_rows(Shape{9, 129}, 2, 1e4);
  const Tensor short_rows(Shape{40, 64}, 3, 3.0);
  const Tensor images(Shape{4, 6, 7, 9}, 4, 1.0);
  const Tensor far_images(Shape{3, 6, 11, 13}, 5, 1e4);
  const Tensor channels_last(Shape{3, 7, 9, 6}, 6, -2.0);
  const Tensor long_runs(Shape{2, 3, 1100}, 7, 1e4);
  for (DType dtype :
       {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16}) {
    Engine engine;
    auto run = [&](const NormalizeSpec& spec) {
      std::string out(spec.input.size * ElementBytes(dtype), '\0');
      auto result = engine.Normalize(spec, out.data());
      EXPECT_TRUE(result.ok()) << result.status();
      results.push_back(out);
      if (result.ok() && result->has_value()) {
        results.push_back(Bits((*result)->running_mean) +
                          Bits((*result)->running_var));
      }
    };
    auto spec_of = [&](NormMode mode, const Tensor& t) {
      NormalizeSpec spec;
      spec.mode = mode;
      spec.input = t.Input(dtype);
      return spec;
    };
    // LayerNorm (PyTorch and BERT), RMSNorm; with weight and bias.
    for (const Tensor* t : {&rows, &far_rows, &short_rows}) {
      for (auto style :
           {LayerNormStyle::kPyTorch, LayerNormStyle::kBertUnbiasedStd}) {
        NormalizeSpec spec = spec_of(NormMode::kLayerNorm, *t);
        spec.layer_norm_style = style;
        const int64_t row = t->shape.back();
        spec.weight = AffineParam{{row}, RandomValues<double>(row, 8, 1, 0.5)};
        spec.bias = AffineParam{{row}, RandomValues<double>(row, 9, 0, 0.5)};
        run(spec);
      }
      run(spec_of(NormMode::kRmsNorm, *t));
      run(spec_of(NormMode::kL2Norm, *t));
    }
    NormalizeSpec two_dims = spec_of(NormMode::kLayerNorm, rows);
    two_dims.normalized_ndim = 2;
    run(two_dims);
    NormalizeSpec l2_two_dims = spec_of(NormMode::kL2Norm, rows);
    l2_two_dims.normalized_ndim = 2;
    run(l2_two_dims);
    // Weight Norm over every axis of an NCHW, a channels-last and a
    // long-run tensor, with and without g.
    for (const Tensor* t : {&images, &channels_last, &long_runs}) {
      for (int32_t axis = 0; axis < static_cast<int32_t>(t->shape.size());
           ++axis) {
        NormalizeSpec weight = spec_of(NormMode::kWeightNorm, *t);
        weight.channel_axis = axis;
        run(weight);
        const int64_t c = t->shape[axis];
        weight.weight = AffineParam{{c}, RandomValues<double>(c, 11, 1, 0.5)};
        run(weight);
      }
    }
    // GroupNorm and InstanceNorm, NCHW and channels-last.
    for (const Tensor* t : {&images, &far_images, &long_runs}) {
      NormalizeSpec group = spec_of(NormMode::kGroupNorm, *t);
      group.num_groups = t->shape[1] == 3 ? 3 : 2;
      run(group);
      run(spec_of(NormMode::kInstanceNorm, *t));
    }
    NormalizeSpec group_last = spec_of(NormMode::kGroupNorm, channels_last);
    group_last.num_groups = 3;
    group_last.channel_axis = -1;
    run(group_last);
    // BatchNorm: Fit and a training step on finite tensors, eval on the
    // ones with NaN and Inf too, in both layouts.
    for (const Tensor* t : {&images, &far_images, &channels_last, &long_runs}) {
      const Tensor finite(t->shape, 10, t == &far_images ? 1e4 : 1.0, false);
      const std::optional<int32_t> axis =
          t == &channels_last ? std::optional<int32_t>(-1) : std::nullopt;
      const std::string model = "m" + std::to_string(results.size());
      auto fitted = engine.Fit(FitSpec{model, finite.Input(dtype), axis});
      EXPECT_TRUE(fitted.ok()) << fitted.status();
      if (fitted.ok()) {
        results.push_back(Bits(fitted->running_mean) +
                          Bits(fitted->running_var));
      }
      for (bool training : {false, true}) {
        NormalizeSpec spec =
            spec_of(NormMode::kBatchNorm, training ? finite : *t);
        spec.model = model;
        spec.channel_axis = axis;
        spec.training = training;
        run(spec);
      }
    }
  }
  return results;
}

TEST(CrossTargetTest, EveryTargetGivesTheSameBytes) {
  for (int64_t streaming : {kDefaultStreamingOutputBytes, int64_t{0}}) {
    SCOPED_TRACE(streaming == 0 ? "streaming stores" : "default stores");
    SetStreamingOutputBytes(streaming);
    std::vector<std::string> targets;
    std::vector<std::vector<std::string>> results;
    ForEachSimdTarget([&](const std::string& target) {
      targets.push_back(target);
      results.push_back(RunAll());
    });
    ASSERT_FALSE(results.empty());
    for (size_t t = 1; t < results.size(); ++t) {
      ASSERT_EQ(results[t].size(), results[0].size());
      for (size_t i = 0; i < results[0].size(); ++i) {
        const std::string& a = results[0][i];
        const std::string& b = results[t][i];
        size_t at = 0;
        while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
        EXPECT_TRUE(a == b)
            << "result " << i << " differs between " << targets[0] << " and "
            << targets[t] << " from byte " << at << " of " << a.size();
      }
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

}  // namespace
}  // namespace normd

// The one proto <-> core place (server/rpc/convert.h): tensors in both wire
// forms viewed as the core sees them, 16-bit values rounded once, malformed
// tensors refused naming the field, and models written back with their
// arrays, against numbers worked by hand.
#include "server/rpc/convert.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "normd/v1/normalizer.pb.h"
#include "server/core/half.h"

namespace normd {
namespace {

v1::Tensor FloatTensor(const std::vector<int64_t>& shape,
                       const std::vector<float>& values) {
  v1::Tensor tensor;
  tensor.set_dtype(v1::FLOAT32);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  tensor.set_data(std::string(reinterpret_cast<const char*>(values.data()),
                              values.size() * sizeof(float)));
  return tensor;
}

TEST(ConvertTest, DataAndValuesFormsViewTheSameElements) {
  const std::vector<float> x = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const v1::Tensor bytes = FloatTensor({2, 3}, x);
  ParsedTensor from_bytes;
  ASSERT_TRUE(ParseTensor(bytes, "input", from_bytes).ok());
  EXPECT_EQ(from_bytes.view.dtype, DType::kFloat32);
  EXPECT_EQ(from_bytes.view.shape, (Shape{2, 3}));
  EXPECT_EQ(from_bytes.view.size, 6);
  EXPECT_FALSE(from_bytes.values_form);

  v1::Tensor values;
  values.set_dtype(v1::FLOAT32);
  values.mutable_shape()->Assign(bytes.shape().begin(), bytes.shape().end());
  for (float v : x) values.add_values(v);
  ParsedTensor from_values;
  ASSERT_TRUE(ParseTensor(values, "input", from_values).ok());
  EXPECT_TRUE(from_values.values_form);
  ASSERT_EQ(from_values.view.size, 6);
  EXPECT_EQ(std::memcmp(from_bytes.view.data, from_values.view.data,
                        x.size() * sizeof(float)),
            0);
  // DATA_TYPE_UNSPECIFIED reads as FLOAT32.
  values.set_dtype(v1::DATA_TYPE_UNSPECIFIED);
  ParsedTensor unspecified;
  ASSERT_TRUE(ParseTensor(values, "input", unspecified).ok());
  EXPECT_EQ(unspecified.view.dtype, DType::kFloat32);
}

TEST(ConvertTest, SixteenBitValuesAreRoundedOnceToNearestEven) {
  // 1/3 = 0x3FD5555555555555: bfloat16 keeps 7 fraction bits, 0x3EAA with
  // the rest (0xAAAB... of the float's lower half, over half an ulp) rounding
  // up to 0x3EAB; float16 keeps 10, 0x3555 (the rest 0x555.. under half).
  // 1 + 2^-8 lies exactly between two bfloat16 values: ties go to the even
  // pattern, 0x3F80 (1.0); float16 holds it exactly (1 + 4 x 2^-10: 0x3C04).
  v1::Tensor tensor;
  tensor.add_shape(3);
  for (double v : {1.0 / 3.0, 1.0 + 1.0 / 256.0, -2.0}) tensor.add_values(v);
  tensor.set_dtype(v1::BFLOAT16);
  ParsedTensor bf16;
  ASSERT_TRUE(ParseTensor(tensor, "input", bf16).ok());
  EXPECT_EQ(bf16.storage_u16, (std::vector<uint16_t>{0x3EAB, 0x3F80, 0xC000}));
  tensor.set_dtype(v1::FLOAT16);
  ParsedTensor fp16;
  ASSERT_TRUE(ParseTensor(tensor, "input", fp16).ok());
  EXPECT_EQ(fp16.storage_u16, (std::vector<uint16_t>{0x3555, 0x3C04, 0xC000}));
}

TEST(ConvertTest, MalformedTensorsNameTheirField) {
  struct Case {
    const char* what;
    v1::Tensor tensor;
    const char* field;
  };
  std::vector<Case> cases;
  {
    v1::Tensor t = FloatTensor({2, 3}, std::vector<float>(6));
    t.add_values(1.0);
    cases.push_back({"both forms", t, "weight: set exactly one"});
  }
  cases.push_back({"short data", FloatTensor({2, 3}, std::vector<float>(5)),
                   "weight.data: has 20 bytes but shape [2,3] of float32 "
                   "needs 24"});
  {
    v1::Tensor t = FloatTensor({4}, std::vector<float>(4));
    t.set_dtype(static_cast<v1::DataType>(99));
    cases.push_back({"unknown dtype", t, "weight.dtype"});
  }
  {
    v1::Tensor t;
    t.add_shape(3);
    t.add_values(1.0);
    cases.push_back({"values count", t, "weight.values: has 1 values"});
  }
  {
    v1::Tensor t;
    t.add_shape(2);
    t.add_shape(-1);
    cases.push_back({"negative dim", t, "weight.shape"});
  }
  {
    v1::Tensor t;
    t.add_shape(2);
    cases.push_back({"no elements given", t, "neither data nor values"});
  }
  for (const Case& c : cases) {
    ParsedTensor parsed;
    const absl::Status status = ParseTensor(c.tensor, "weight", parsed);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(absl::StrContains(status.message(), c.field))
        << c.what << ": " << status.message();
  }
}

TEST(ConvertTest, ModelsAreWrittenWithTheirPooledStatistics) {
  // The worked BatchNorm1d(2) example: x = [[1,2],[3,6],[5,10],[7,14]],
  // pooled mean [4, 8], M2 [20, 80] (biased variance [5, 20]).
  BatchNormModel model;
  model.name = "bn";
  model.num_features = 2;
  model.num_batches_tracked = 1;
  model.sample_count = 4;
  model.running_mean = {0.4, 0.8};
  model.running_var = {0.9 + 0.1 * 20.0 / 3.0, 0.9 + 0.1 * 80.0 / 3.0};
  model.weight = {1.0, 1.0};
  model.bias = {0.0, 0.0};
  model.pooled = {Moments{4, 4.0, 20.0}, Moments{4, 8.0, 80.0}};
  model.generation = 2;
  v1::ModelState state;
  ToModelState(model, /*with_arrays=*/true, state);
  EXPECT_EQ(state.name(), "bn");
  EXPECT_EQ(state.num_features(), 2);
  EXPECT_EQ(state.sample_count(), 4);
  EXPECT_EQ(state.generation(), 2u);
  EXPECT_EQ(std::vector<double>(state.mean().begin(), state.mean().end()),
            (std::vector<double>{4.0, 8.0}));
  EXPECT_EQ(std::vector<double>(state.var().begin(), state.var().end()),
            (std::vector<double>{5.0, 20.0}));
  EXPECT_EQ(std::vector<double>(state.running_mean().begin(),
                                state.running_mean().end()),
            model.running_mean);
  // Without arrays (ListModels): the counters only.
  v1::ModelState summary;
  ToModelState(model, /*with_arrays=*/false, summary);
  EXPECT_EQ(summary.sample_count(), 4);
  EXPECT_EQ(summary.mean_size(), 0);
  EXPECT_EQ(summary.running_var_size(), 0);
}

TEST(ConvertTest, CreateModelRequestsKeepWhatWasLeftUnset) {
  v1::CreateModelRequest request;
  request.set_name("m");
  request.set_num_features(3);
  request.set_cumulative_average(true);
  request.add_running_mean(1.0);
  ModelSpec spec = ToModelSpec(request);
  EXPECT_EQ(spec.name, "m");
  EXPECT_EQ(spec.num_features, 3);
  EXPECT_TRUE(spec.cumulative_average);
  EXPECT_FALSE(spec.momentum.has_value());  // The core applies 0.1.
  EXPECT_FALSE(spec.eps.has_value());       // The core applies 1e-5.
  EXPECT_EQ(spec.running_mean, (std::vector<double>{1.0}));
  request.set_momentum(0.25);
  request.set_eps(1e-3);
  spec = ToModelSpec(request);
  EXPECT_EQ(spec.momentum, 0.25);
  EXPECT_EQ(spec.eps, 1e-3);
}

}  // namespace
}  // namespace normd

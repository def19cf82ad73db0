// The raw (zero-copy) Normalize path against the protobuf reference path:
// for random requests cut into random slices, DoNormalizeRaw's response bytes
// must equal the protobuf serialization of DoNormalize's response, and both
// paths must fail alike on bad requests; the same for the Open Inference
// Protocol's raw ModelInfer against its protobuf path. Runs in-process (no
// transport).
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "inference/grpc_predict_v2.pb.h"
#include "normd/v1/normalizer.pb.h"
#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/streaming.h"
#include "server/rpc/grpc_metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"
#include "server/service/buffer_pool.h"
#include "tests/testing/service_stack.h"

namespace normd {
namespace {

// One service with its own engine and metrics, and the gRPC services on it.
struct Stack : testing::ServiceStack {
  GrpcMetrics grpc_metrics{registry};
  NormalizerService service{
      GrpcFrontEnd{testing::ServiceStack::service, grpc_metrics}};
  OipService oip{GrpcFrontEnd{testing::ServiceStack::service, grpc_metrics},
                 inference};
};

// `bytes` cut at `cuts` random places; each piece its own slice, copied to
// a fresh allocation at an odd offset so that no alignment is given.
grpc::ByteBuffer Slices(const std::string& bytes, int cuts, std::mt19937& gen) {
  std::vector<size_t> at = {0, bytes.size()};
  std::uniform_int_distribution<size_t> pick(0, bytes.size());
  for (int i = 0; i < cuts; ++i) at.push_back(pick(gen));
  std::sort(at.begin(), at.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < at.size(); ++i) {
    const size_t n = at[i + 1] - at[i];
    std::string piece = std::string(gen() % 7, '\0') + bytes.substr(at[i], n);
    grpc::Slice whole(piece);
    slices.push_back(whole.sub(piece.size() - n, piece.size()));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void FillTensor(v1::Tensor& tensor, const std::vector<int64_t>& shape,
                v1::DataType dtype, bool values_form, std::mt19937& gen) {
  tensor.set_dtype(dtype);
  int64_t count = 1;
  for (int64_t d : shape) {
    tensor.add_shape(d);
    count *= d;
  }
  std::normal_distribution<double> dist(2.0, 3.0);
  if (values_form) {
    for (int64_t i = 0; i < count; ++i) tensor.add_values(dist(gen));
    return;
  }
  std::string data;
  for (int64_t i = 0; i < count; ++i) {
    const double v = dist(gen);
    const float f = static_cast<float>(v);
    const uint16_t h = DoubleToHalf(
        dtype == v1::BFLOAT16 ? DType::kBFloat16 : DType::kFloat16, v);
    switch (dtype) {
      case v1::FLOAT64:
        data.append(reinterpret_cast<const char*>(&v), 8);
        break;
      case v1::BFLOAT16:
      case v1::FLOAT16:
        data.append(reinterpret_cast<const char*>(&h), 2);
        break;
      default:
        data.append(reinterpret_cast<const char*>(&f), 4);
    }
  }
  tensor.set_data(data);
}

v1::DataType RandomDType(std::mt19937& gen) {
  constexpr v1::DataType kTypes[] = {v1::FLOAT32, v1::FLOAT64, v1::BFLOAT16,
                                     v1::FLOAT16};
  return kTypes[gen() % 4];
}

v1::NormalizeRequest RandomRequest(std::mt19937& gen, int64_t max_dim) {
  std::uniform_int_distribution<int64_t> dim(1, max_dim);
  v1::NormalizeRequest request;
  // LN, BN eval, BN training, RMSNorm, GroupNorm, InstanceNorm.
  const int kind = gen() % 6;
  std::vector<int64_t> shape;
  const int rank = 2 + gen() % 3;
  for (int i = 0; i < rank; ++i) shape.push_back(dim(gen));
  FillTensor(*request.mutable_input(), shape, RandomDType(gen), gen() % 5 == 0,
             gen);
  if (gen() % 2) request.set_request_id("req-" + std::to_string(gen()));
  if (kind == 0 || kind == 3) {
    request.set_mode(kind == 0 ? v1::LAYER_NORM : v1::RMS_NORM);
    const int k = 1 + gen() % 2;
    request.set_normalized_ndim(k);
    if (gen() % 2) {
      std::vector<int64_t> tail(shape.end() - k, shape.end());
      FillTensor(*request.mutable_weight(), tail, RandomDType(gen), gen() % 2,
                 gen);
      FillTensor(*request.mutable_bias(), tail, RandomDType(gen), gen() % 2,
                 gen);
    }
    if (gen() % 2) request.set_eps(1e-3);
  } else if (kind >= 4) {
    request.set_mode(kind == 4 ? v1::GROUP_NORM : v1::INSTANCE_NORM);
    if (kind == 4) request.set_num_groups(shape[1] % 2 == 0 ? 2 : 1);
    if (gen() % 2) {
      FillTensor(*request.mutable_weight(), {shape[1]}, RandomDType(gen),
                 gen() % 2, gen);
    }
  } else {
    request.set_mode(v1::BATCH_NORM);
    request.set_model("m" + std::to_string(shape[1]));
    request.set_training(kind == 2);
  }
  return request;
}

// Both stacks get the same models, so BatchNorm answers are comparable.
void CreateModels(Stack& a, Stack& b, int64_t max_dim) {
  for (int64_t c = 1; c <= max_dim; ++c) {
    ModelSpec spec;
    spec.name = "m" + std::to_string(c);
    spec.num_features = c;
    for (int64_t i = 0; i < c; ++i) {
      spec.running_mean.push_back(0.5 * i);
      spec.running_var.push_back(1.0 + i);
    }
    ASSERT_TRUE(a.engine.store().Create(spec).ok());
    ASSERT_TRUE(b.engine.store().Create(spec).ok());
  }
}

TEST(RawPathTest, ResponsesAreByteIdenticalToProtobufPath) {
  Stack reference, raw;
  constexpr int64_t kMaxDim = 9;
  CreateModels(reference, raw, kMaxDim);
  std::mt19937 gen(20261123);
  int compared = 0;
  for (int i = 0; i < 300; ++i) {
    const v1::NormalizeRequest request = RandomRequest(gen, kMaxDim);
    const std::string bytes = request.SerializeAsString();
    v1::NormalizeResponse expected;
    const absl::Status expected_status =
        reference.service.DoNormalize(request, expected);
    grpc::ByteBuffer response;
    const absl::Status status =
        raw.service.DoNormalizeRaw(Slices(bytes, gen() % 6, gen), response);
    ASSERT_EQ(status, expected_status) << request.ShortDebugString();
    if (!status.ok()) continue;  // E.g. training on 1 value per channel.
    ++compared;
    ASSERT_EQ(Flatten(response), expected.SerializeAsString())
        << "case " << i << ": " << request.ShortDebugString();
  }
  EXPECT_GT(compared, 250);
}

TEST(RawPathTest, LargeAndStreamedOutputsAreByteIdentical) {
  Stack reference, raw;
  std::mt19937 gen(7);
  // Past the one-slice size, then past the streaming-store threshold.
  for (std::vector<int64_t> shape :
       {std::vector<int64_t>{64, 1000}, std::vector<int64_t>{8, 9, 64, 64}}) {
    v1::NormalizeRequest request;
    request.set_mode(v1::LAYER_NORM);
    FillTensor(*request.mutable_input(), shape, v1::FLOAT32, false, gen);
    SetStreamingOutputBytes(shape == std::vector<int64_t>{64, 1000}
                                ? kDefaultStreamingOutputBytes
                                : 1 << 20);
    v1::NormalizeResponse expected;
    ASSERT_TRUE(reference.service.DoNormalize(request, expected).ok());
    grpc::ByteBuffer response;
    ASSERT_TRUE(raw.service
                    .DoNormalizeRaw(
                        Slices(request.SerializeAsString(), 40, gen), response)
                    .ok());
    EXPECT_EQ(Flatten(response), expected.SerializeAsString());
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

TEST(RawPathTest, BadRequestsFailAlikeOnBothPaths) {
  Stack reference, raw;
  std::mt19937 gen(3);
  std::vector<v1::NormalizeRequest> bad(5);
  bad[0].set_mode(v1::LAYER_NORM);  // No input at all.
  bad[1].set_mode(v1::LAYER_NORM);  // data length does not match shape.
  bad[1].mutable_input()->add_shape(2);
  bad[1].mutable_input()->add_shape(3);
  bad[1].mutable_input()->set_data(std::string(20, '\0'));
  bad[2] = bad[1];  // Both data and values.
  bad[2].mutable_input()->set_data(std::string(24, '\0'));
  bad[2].mutable_input()->add_values(1.0);
  bad[3] = bad[2];  // Unknown model for BatchNorm eval.
  bad[3].mutable_input()->clear_values();
  bad[3].set_mode(v1::BATCH_NORM);
  bad[3].set_model("nope");
  bad[4] = bad[3];  // Mode unset.
  bad[4].clear_mode();
  for (const v1::NormalizeRequest& request : bad) {
    v1::NormalizeResponse unused;
    const absl::Status expected =
        reference.service.DoNormalize(request, unused);
    grpc::ByteBuffer response;
    const absl::Status status = raw.service.DoNormalizeRaw(
        Slices(request.SerializeAsString(), 3, gen), response);
    EXPECT_FALSE(expected.ok());
    EXPECT_EQ(status, expected) << request.ShortDebugString();
  }
}

TEST(RawPathTest, UnusualWireFormsMeanWhatProtobufSays) {
  Stack reference, raw;
  std::mt19937 gen(5);
  // Concatenated messages merge: the input's fields arrive in two parts, and
  // data twice (the last wins).
  v1::NormalizeRequest head;
  head.set_mode(v1::LAYER_NORM);
  head.mutable_input()->add_shape(2);
  head.mutable_input()->add_shape(2);
  v1::NormalizeRequest first_data, last_data;
  const float zeros[4] = {0, 0, 0, 0};
  const float values[4] = {1, 2, 4, 8};
  first_data.mutable_input()->set_data(zeros, sizeof(zeros));
  last_data.mutable_input()->set_data(values, sizeof(values));
  const std::string bytes = head.SerializeAsString() +
                            first_data.SerializeAsString() +
                            last_data.SerializeAsString();
  v1::NormalizeRequest merged;
  ASSERT_TRUE(merged.ParseFromString(bytes));
  v1::NormalizeResponse expected;
  ASSERT_TRUE(reference.service.DoNormalize(merged, expected).ok());
  grpc::ByteBuffer response;
  ASSERT_TRUE(raw.service.DoNormalizeRaw(Slices(bytes, 2, gen), response).ok());
  EXPECT_EQ(Flatten(response), expected.SerializeAsString());
  // Row [1, 2]: mean 1.5, biased variance 0.25 -> (x - 1.5) / sqrt(0.25 + eps).
  v1::NormalizeResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(response)));
  const float* out =
      reinterpret_cast<const float*>(parsed.output().data().data());
  EXPECT_NEAR(out[0], -0.5 / std::sqrt(0.25 + 1e-5), 1e-6);

  // Bytes that are not a NormalizeRequest at all.
  const std::string garbage = "\x1a\xff\xff\xff\xff\x0f\x01";
  const absl::Status status =
      raw.service.DoNormalizeRaw(Slices(garbage, 1, gen), response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("request"), std::string::npos) << status;
}

// A ModelInferRequest of `model` with random FP32 or FP64 raw contents for
// each of `inputs` (name, shape).
inference::ModelInferRequest OipRequest(
    const std::string& model, const std::string& id, bool fp64,
    const std::vector<std::pair<std::string, std::vector<int64_t>>>& inputs,
    std::mt19937& gen) {
  inference::ModelInferRequest request;
  request.set_model_name(model);
  request.set_id(id);
  std::normal_distribution<double> dist(1.0, 2.0);
  for (const auto& [name, shape] : inputs) {
    auto& input = *request.add_inputs();
    input.set_name(name);
    input.set_datatype(fp64 ? "FP64" : "FP32");
    int64_t count = 1;
    for (int64_t d : shape) {
      input.add_shape(d);
      count *= d;
    }
    std::string& bytes = *request.add_raw_input_contents();
    for (int64_t i = 0; i < count; ++i) {
      const double v = dist(gen);
      const float f = static_cast<float>(v);
      bytes.append(fp64 ? reinterpret_cast<const char*>(&v)
                        : reinterpret_cast<const char*>(&f),
                   fp64 ? sizeof(v) : sizeof(f));
    }
  }
  return request;
}

// Calls of every shape in turn on one thread (weights then none, parameters
// then none, long ids then none, typed contents, errors) must each give the
// protobuf path's bytes and status, whatever slices the request arrives in.
TEST(RawPathTest, OipCallsInTurnAreByteIdenticalToProtobufPath) {
  Stack reference, raw;
  std::mt19937 gen(11);
  std::vector<inference::ModelInferRequest> requests;
  requests.push_back(
      OipRequest("layer_norm", std::string(40, 'i'), false,
                 {{"input", {4, 8}}, {"weight", {8}}, {"bias", {8}}}, gen));
  (*requests.back().mutable_parameters())["eps"].set_double_param(1e-3);
  requests.push_back(
      OipRequest("rms_norm", "", true, {{"input", {2, 16}}}, gen));
  requests.push_back(OipRequest("group_norm", "g", false,
                                {{"input", {2, 4, 3}}, {"weight", {4}}}, gen));
  (*requests.back().mutable_parameters())["num_groups"].set_int64_param(2);
  requests.push_back(
      OipRequest("layer_norm", "", false, {{"input", {3}}}, gen));
  (*requests.back().mutable_parameters())["nope"].set_bool_param(true);
  requests.push_back(OipRequest("instance_norm", "typed", false, {}, gen));
  auto& typed = *requests.back().add_inputs();
  typed.set_name("input");
  typed.set_datatype("FP32");
  typed.add_shape(1);
  typed.add_shape(2);
  typed.add_shape(3);
  for (int i = 0; i < 6; ++i) typed.mutable_contents()->add_fp32_contents(i);
  requests.push_back(
      OipRequest("layer_norm", "last", false, {{"input", {1, 768}}}, gen));
  int compared = 0;
  for (int round = 0; round < 3; ++round) {
    for (const inference::ModelInferRequest& request : requests) {
      inference::ModelInferResponse expected;
      const absl::Status expected_status =
          reference.oip.DoModelInfer(request, expected);
      grpc::ByteBuffer response;
      const absl::Status status = raw.oip.DoModelInferRaw(
          Slices(request.SerializeAsString(), round * 2, gen), response);
      ASSERT_EQ(status, expected_status) << request.ShortDebugString();
      if (!status.ok()) continue;
      ++compared;
      EXPECT_EQ(Flatten(response), expected.SerializeAsString())
          << "round " << round << ": " << request.model_name() << " "
          << request.id();
    }
  }
  EXPECT_EQ(compared, 3 * 5);
}

TEST(BufferPoolTest, ReusesLargeBuffersWithinItsBudget) {
  BufferPool& pool = BufferPool::Global();
  // Other tests in this process may have left buffers in the pool.
  const size_t retained = pool.retained_bytes();
  pool.SetMaxRetainedBytes(retained + (5 << 20));
  void* a = pool.Acquire(4 << 20);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  static_cast<char*>(a)[(4 << 20) - 1] = 1;  // The whole size is usable.
  BufferPool::Release(a);
  EXPECT_EQ(pool.retained_bytes(), retained + (4 << 20));
  // The same size class (3.5 MiB < size <= 4 MiB) gets the same block back.
  void* b = pool.Acquire((4 << 20) - 1000);
  EXPECT_EQ(b, a);
  EXPECT_EQ(pool.retained_bytes(), retained);
  // Past the budget, released buffers are freed, not kept.
  void* c = pool.Acquire(4 << 20);
  BufferPool::Release(b);
  BufferPool::Release(c);
  EXPECT_LE(pool.retained_bytes(), retained + (5u << 20));
  // Small buffers are never pooled.
  void* small = pool.Acquire(1000);
  BufferPool::Release(small);
  EXPECT_LE(pool.retained_bytes(), retained + (5u << 20));
  pool.SetMaxRetainedBytes(0);
  EXPECT_EQ(pool.retained_bytes(), 0u);
  pool.SetMaxRetainedBytes(BufferPool::kDefaultRetainedBytes);
}

}  // namespace
}  // namespace normd

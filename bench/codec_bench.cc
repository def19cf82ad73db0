// In-process cost of one Normalize in the RPC layer, without the transport:
// the raw path the server runs (DoNormalizeRaw: ByteBuffer in, ByteBuffer
// out) against the protobuf reference path (parse, DoNormalize, serialize)
// and against a plain copy of the request bytes, and the Open Inference
// Protocol's raw ModelInfer of the same tensor (DoModelInferRaw). Small
// requests show the fixed per-call overhead; 4 MiB ones the per-byte cost.
//
//   build/bench/codec_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "normd/v1/normalizer.pb.h"
#include "server/http/infer_body.h"
#include "server/http/rest_json.h"
#include "server/rpc/grpc_metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"
#include "tests/testing/service_stack.h"

namespace normd {
namespace {

// A LayerNorm request of [rows, cols] fp32, serialized.
std::string Request(int64_t rows, int64_t cols) {
  v1::NormalizeRequest request;
  request.set_mode(v1::LAYER_NORM);
  v1::Tensor& input = *request.mutable_input();
  input.set_dtype(v1::FLOAT32);
  input.add_shape(rows);
  input.add_shape(cols);
  std::vector<float> values(rows * cols);
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (float& v : values) v = dist(gen);
  input.set_data(values.data(), values.size() * sizeof(float));
  return request.SerializeAsString();
}

grpc::ByteBuffer ToBuffer(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The same LayerNorm as the Open Inference Protocol's ModelInfer with raw
// contents, serialized.
std::string OipRequest(int64_t rows, int64_t cols) {
  v1::NormalizeRequest native;
  native.ParseFromString(Request(rows, cols));
  inference::ModelInferRequest request;
  request.set_model_name("layer_norm");
  auto& input = *request.add_inputs();
  input.set_name("input");
  input.set_datatype("FP32");
  input.add_shape(rows);
  input.add_shape(cols);
  request.add_raw_input_contents(native.input().data());
  return request.SerializeAsString();
}

struct Fixture {
  testing::ServiceStack stack;
  GrpcMetrics grpc_metrics{stack.registry};
  NormalizerService service{GrpcFrontEnd{stack.service, grpc_metrics}};
  OipService oip{GrpcFrontEnd{stack.service, grpc_metrics}, stack.inference};
};

Fixture& Shared() {
  static Fixture* fixture = new Fixture();
  return *fixture;
}

void BM_Raw(benchmark::State& state) {
  const grpc::ByteBuffer request =
      ToBuffer(Request(state.range(0), state.range(1)));
  for (auto _ : state) {
    grpc::ByteBuffer response;
    if (!Shared().service.DoNormalizeRaw(request, response).ok()) {
      state.SkipWithError("DoNormalizeRaw failed");
    }
    benchmark::DoNotOptimize(response);
  }
  state.SetBytesProcessed(state.iterations() * request.Length());
}

// The OIP's raw ModelInfer: the translation's cost over BM_Raw.
void BM_OipRaw(benchmark::State& state) {
  const grpc::ByteBuffer request =
      ToBuffer(OipRequest(state.range(0), state.range(1)));
  for (auto _ : state) {
    grpc::ByteBuffer response;
    if (!Shared().oip.DoModelInferRaw(request, response).ok()) {
      state.SkipWithError("DoModelInferRaw failed");
    }
    benchmark::DoNotOptimize(response);
  }
  state.SetBytesProcessed(state.iterations() * request.Length());
}

void BM_Protobuf(benchmark::State& state) {
  const std::string bytes = Request(state.range(0), state.range(1));
  for (auto _ : state) {
    v1::NormalizeRequest request;
    request.ParseFromString(bytes);
    v1::NormalizeResponse response;
    if (!Shared().service.DoNormalize(request, response).ok()) {
      state.SkipWithError("DoNormalize failed");
    }
    std::string out = response.SerializeAsString();
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(state.iterations() * bytes.size());
}

void BM_CopyRequest(benchmark::State& state) {
  const std::string bytes = Request(state.range(0), state.range(1));
  for (auto _ : state) {
    std::string copy = bytes;
    benchmark::DoNotOptimize(copy);
  }
  state.SetBytesProcessed(state.iterations() * bytes.size());
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 768})->Args({2048, 512})->UseRealTime();
}
BENCHMARK(BM_Raw)->Apply(Shapes);
BENCHMARK(BM_OipRaw)->Apply(Shapes);
BENCHMARK(BM_Protobuf)->Apply(Shapes);
BENCHMARK(BM_CopyRequest)->Apply(Shapes);

// The REST front-end's JSON cost per tensor value (items/s is values/s):
// parsing an infer body of `count` FP32 numbers (as a client's
// json.dumps would write them) into the service's request, and formatting a
// response of `count` values back to JSON. The compute between is left
// out: these are what JSON adds over binary data.
std::string JsonInferBody(int64_t count) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(3.0f, 2.0f);
  std::string body =
      absl::StrCat(R"({"inputs":[{"name":"input","datatype":"FP32","shape":[)",
                   count, R"(],"data":[)");
  for (int64_t i = 0; i < count; ++i) {
    absl::StrAppend(&body, i > 0 ? "," : "", static_cast<double>(normal(rng)));
  }
  return body + "]}]}";
}

void BM_RestJsonParse(benchmark::State& state) {
  const std::string body = JsonInferBody(state.range(0));
  for (auto _ : state) {
    RestInferRequest request;
    if (!ParseInferBody(body, body.size(), std::nullopt, "layer_norm", "",
                        request)
             .ok()) {
      state.SkipWithError("ParseInferBody failed");
    }
    benchmark::DoNotOptimize(request);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.SetBytesProcessed(state.iterations() * body.size());
}

void BM_RestJsonFormat(benchmark::State& state) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::string values(static_cast<size_t>(state.range(0)) * sizeof(float), 0);
  for (int64_t i = 0; i < state.range(0); ++i) {
    const float v = normal(rng);
    std::memcpy(values.data() + i * sizeof(float), &v, sizeof(v));
  }
  InferReply reply;
  reply.output.datatype = "FP32";
  reply.output.shape = {state.range(0)};
  reply.output.elements = state.range(0);
  reply.output.bytes = state.range(0) * 4;
  for (auto _ : state) {
    std::string body =
        FormatInferReply("layer_norm", "", reply, values, /*binary=*/false);
    benchmark::DoNotOptimize(body);
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

BENCHMARK(BM_RestJsonParse)->Arg(768)->Arg(1 << 20)->UseRealTime();
BENCHMARK(BM_RestJsonFormat)->Arg(768)->Arg(1 << 20)->UseRealTime();

}  // namespace
}  // namespace normd

BENCHMARK_MAIN();

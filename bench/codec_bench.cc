// In-process cost of one Normalize in the RPC layer, without the transport:
// the raw path the server runs (DoNormalizeRaw: ByteBuffer in, ByteBuffer
// out) against the protobuf reference path (parse, DoNormalize, serialize)
// and against a plain copy of the request bytes. Small requests show the
// fixed per-call overhead; 4 MiB ones the per-byte cost.
//
//   build/bench/codec_bench --benchmark_repetitions=3
#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>
#include <prometheus/registry.h>

#include <random>
#include <string>
#include <vector>

#include "normd/v1/normalizer.pb.h"
#include "server/core/engine.h"
#include "server/rpc/metrics.h"
#include "server/rpc/normalizer_service.h"

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

struct Fixture {
  prometheus::Registry registry;
  ServerMetrics metrics{registry};
  Engine engine;
  Admission admission{0, 0};
  NormalizerService service{engine, metrics, admission};
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
BENCHMARK(BM_Protobuf)->Apply(Shapes);
BENCHMARK(BM_CopyRequest)->Apply(Shapes);

}  // namespace
}  // namespace normd

BENCHMARK_MAIN();

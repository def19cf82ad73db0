// libFuzzer target over normctl's ONNX reading (client/checkpoint): the
// bytes are parsed as an onnx.ModelProto and, if they parse, read as
// BatchNorm layers. Must answer with a status, never crash or hang (Identity
// chains and cycles, huge declared dims, typed and raw data that disagree),
// and every layer it accepts must pass CheckLayer with one C throughout.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "client/checkpoint/layer_values.h"
#include "client/checkpoint/onnx_layers.h"

namespace {

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "onnx_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) return 0;
  const absl::StatusOr<std::vector<normd::client::CheckpointLayer>> layers =
      normd::client::LayersFromOnnx(model, "fuzz.onnx");
  if (!layers.ok()) {
    Check(layers.status().code() == absl::StatusCode::kInvalidArgument,
          "a bad model is not INVALID_ARGUMENT");
    return 0;
  }
  Check(!layers->empty(), "no layers, yet OK");
  for (const normd::client::CheckpointLayer& layer : *layers) {
    Check(normd::client::CheckLayer(layer, "fuzz").ok(),
          "an accepted layer fails its check");
    Check(layer.eps.has_value() && layer.momentum.has_value(),
          "an ONNX layer without its settings");
  }
  return 0;
}

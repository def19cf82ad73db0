// libFuzzer target over normctl's safetensors reading (client/checkpoint):
// the bytes are parsed as a whole file and, if they parse, read as
// BatchNorm layers. Each step must answer with a status, never crash, hang
// or over-allocate, and what it accepts must be self-consistent: every
// tensor's data lies inside the bytes and holds exactly its dtype and
// shape's bytes, the tensors tile the data, every layer passes CheckLayer,
// and encoding the tensors again gives a file that parses to the same
// tensors.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/checkpoint/checkpoint.h"
#include "client/checkpoint/layer_values.h"
#include "client/checkpoint/safetensors.h"

namespace {

// Aborts (a finding) when a property fails.
void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "safetensors_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace normd::client;  // NOLINT: a fuzz target's one function.
  const absl::string_view file(reinterpret_cast<const char*>(data), size);
  // A small header limit, so that the limit's own path is reached too.
  const absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ParseSafetensors(file, "fuzz.safetensors", 4096);
  if (!tensors.ok()) {
    Check(tensors.status().code() == absl::StatusCode::kInvalidArgument,
          "a bad file is not INVALID_ARGUMENT");
    return 0;
  }
  std::vector<SafetensorsOutput> again;
  for (const SafetensorsTensor& tensor : *tensors) {
    Check(tensor.data.data() >= file.data() &&
              tensor.data.data() + tensor.data.size() <=
                  file.data() + file.size(),
          "a tensor's data is outside the file");
    int64_t bytes = SafetensorsElementBytes(tensor.dtype);
    Check(bytes > 0, "an unknown dtype was accepted");
    for (int64_t dim : tensor.shape) bytes *= dim;
    Check(bytes == static_cast<int64_t>(tensor.data.size()),
          "a tensor's bytes differ from its dtype and shape");
    again.push_back(
        {tensor.name, tensor.dtype, tensor.shape, std::string(tensor.data)});
  }
  const absl::StatusOr<std::string> encoded = EncodeSafetensors(again);
  Check(encoded.ok(), "EncodeSafetensors refused parsed tensors");
  const absl::StatusOr<std::vector<SafetensorsTensor>> reread =
      ParseSafetensors(*encoded, "again.safetensors", uint64_t{1} << 30);
  Check(reread.ok() && reread->size() == tensors->size(),
        "re-encoded tensors do not parse back");
  for (size_t i = 0; i < reread->size(); ++i) {
    Check((*reread)[i].name == (*tensors)[i].name &&
              (*reread)[i].data == (*tensors)[i].data,
          "re-encoded tensors differ");
  }
  const absl::StatusOr<std::vector<CheckpointLayer>> layers =
      LayersFromSafetensors(*tensors, "fuzz.safetensors");
  if (!layers.ok()) {
    Check(layers.status().code() == absl::StatusCode::kInvalidArgument,
          "bad layers are not INVALID_ARGUMENT");
    return 0;
  }
  for (const CheckpointLayer& layer : *layers) {
    Check(CheckLayer(layer, "fuzz").ok(), "an accepted layer fails its check");
  }
  const normd::v1::CreateModelsRequest request =
      CreateModelsFor(*layers, "p", {});
  Check(request.models_size() == static_cast<int>(layers->size()),
        "not one request per layer");
  return 0;
}

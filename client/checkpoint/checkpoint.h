// Trained models in and out of normd (normctl import-checkpoint and
// export-checkpoint): the BatchNorm layers of a safetensors file or an ONNX
// model as CreateModels requests, and models as a PyTorch state_dict in
// safetensors. Stateless functions; thread-safe.
#ifndef NORMD_CLIENT_CHECKPOINT_CHECKPOINT_H_
#define NORMD_CLIENT_CHECKPOINT_CHECKPOINT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/checkpoint/safetensors.h"
#include "normd/v1/normalizer.pb.h"

namespace normd::client {

// One per-channel tensor of a layer and the name it has in the file (for
// messages).
struct LayerTensor {
  std::string source;
  std::vector<double> values;
};

// What a checkpoint holds for one BatchNorm layer.
struct CheckpointLayer {
  // The PyTorch module path ("layer1.0.bn1"; "" for a bare module's
  // state_dict).
  std::string layer;
  LayerTensor running_mean;
  LayerTensor running_var;
  LayerTensor weight;  // Empty: none in the file.
  LayerTensor bias;
  int64_t num_batches_tracked = 0;
  // From an ONNX node's attributes, in PyTorch's convention.
  std::optional<double> eps;
  std::optional<double> momentum;
};

// The largest safetensors header read (normctl --max_header_bytes).
inline constexpr uint64_t kDefaultMaxHeaderBytes = 100'000'000;

// The BatchNorm layers of a parsed safetensors file, sorted by name: every
// group of tensors `<layer>.running_mean` and `<layer>.running_var`, with
// `<layer>.weight`, `.bias` and `.num_batches_tracked` when present.
// INVALID_ARGUMENT naming `file_name`, the layer and the tensor if one of
// the pair is missing, a tensor is not [C] of a float dtype (the counter: an
// integer scalar >= 0), the tensors of a layer disagree on C, a value is not
// finite or a variance is negative, or there is no layer at all.
absl::StatusOr<std::vector<CheckpointLayer>> LayersFromSafetensors(
    const std::vector<SafetensorsTensor>& tensors, absl::string_view file_name);

// The BatchNorm layers of the file at `path`, by its kind: `.safetensors`
// (memory-mapped, never read whole) or `.onnx`. A PyTorch pickle (`.pt`,
// `.pth`, `.bin`, `.ckpt`) or an unknown kind is INVALID_ARGUMENT naming the
// formats read and the Python helper that reads a module instead.
absl::StatusOr<std::vector<CheckpointLayer>> ReadCheckpoint(
    const std::string& path, uint64_t max_header_bytes);

// Settings that replace the file's for every layer (normctl's --momentum,
// --cumulative_average and --eps, as for `create`).
struct LayerOverrides {
  std::optional<double> momentum;
  bool cumulative_average = false;
  std::optional<double> eps;
};

// The model name of `layer` under `prefix`: "P.<layer>", or P for "".
std::string ModelNameOf(absl::string_view prefix, absl::string_view layer);

// One CreateModelRequest per layer, named ModelNameOf(prefix, layer), its
// drift reference set from its running statistics (source checkpoint).
v1::CreateModelsRequest CreateModelsFor(
    const std::vector<CheckpointLayer>& layers, absl::string_view prefix,
    const LayerOverrides& overrides);

// Models as a PyTorch state_dict: for each model named "P.<layer>" (or P),
// `<layer>.running_mean`, `.running_var`, `.weight`, `.bias` (float32) and
// `.num_batches_tracked` (int64, a scalar), sorted by key. INVALID_ARGUMENT
// naming the model and field if a value does not fit float32 or a model is
// not under the prefix.
absl::StatusOr<std::vector<SafetensorsOutput>> StateDictOf(
    const std::vector<v1::ModelState>& models, absl::string_view prefix);

}  // namespace normd::client

#endif  // NORMD_CLIENT_CHECKPOINT_CHECKPOINT_H_

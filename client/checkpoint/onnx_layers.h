// The BatchNorm layers of an ONNX model: every BatchNormalization node of
// the main graph, its scale, B, input_mean and input_var initializers (raw
// or typed, float, double, float16 or bfloat16) and its epsilon and
// momentum attributes. Stateless functions; thread-safe.
#ifndef NORMD_CLIENT_CHECKPOINT_ONNX_LAYERS_H_
#define NORMD_CLIENT_CHECKPOINT_ONNX_LAYERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/checkpoint/checkpoint.h"
#include "onnx/onnx_pb.h"

namespace normd::client {

// The layers of `model`, in node order. A layer is named after its mean
// initializer minus ".running_mean" (PyTorch's exporter keeps state_dict
// names), else after its node. Momentum is PyTorch's (1 - ONNX's); eps and
// momentum are the shortest decimals that give the attributes' float32
// values. INVALID_ARGUMENT naming `file_name`, the node and the tensor if a
// statistic is not an initializer, keeps its data in an external file, is
// not [C] of a float type, or fails CheckLayer; or if there is no
// BatchNormalization node.
absl::StatusOr<std::vector<CheckpointLayer>> LayersFromOnnx(
    const onnx::ModelProto& model, absl::string_view file_name);

// Parses the .onnx file at `path` (streamed from the file, held once) and
// returns its layers; INVALID_ARGUMENT if it is not an ONNX model.
absl::StatusOr<std::vector<CheckpointLayer>> ReadOnnxLayers(
    const std::string& path);

}  // namespace normd::client

#endif  // NORMD_CLIENT_CHECKPOINT_ONNX_LAYERS_H_

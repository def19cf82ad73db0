// The models the Open Inference Protocol sees: the built-in stateless ones
// (layer_norm, rms_norm, group_norm, instance_norm, l2_norm, weight_norm) and
// every BatchNorm model of the store, each with one version, "1"; the
// datatypes they take; and what their metadata and configuration say.
// Constants and pure functions; thread-safe.
#ifndef NORMD_SERVER_SERVICE_OIP_MODELS_H_
#define NORMD_SERVER_SERVICE_OIP_MODELS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/core/engine.h"
#include "server/core/model.h"
#include "server/core/tensor.h"

namespace normd {

// The one version every OIP model has.
inline constexpr char kOipModelVersion[] = "1";

// The stateless mode a built-in model name runs; nullopt for any other
// name, which stands for a BatchNorm model of the store.
std::optional<NormMode> BuiltinOipModel(absl::string_view name);

// The built-in models' names, in a fixed order.
std::vector<std::string> BuiltinOipModelNames();

// The dtype of an OIP datatype ("FP32", "FP64", "FP16", "BF16"); nullopt for
// any other.
std::optional<DType> OipDatatype(absl::string_view datatype);
// The OIP datatype of `dtype`.
const char* OipDatatypeName(DType dtype);

// NOT_FOUND naming `field` unless `version` is "" or "1".
absl::Status CheckOipVersion(absl::string_view version, absl::string_view model,
                             absl::string_view field);

// One tensor of a model's metadata: its name, datatype and shape (-1: any
// size).
struct OipTensorMetadata {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
};

// What the Open Inference Protocol's model metadata says of a model.
struct OipModelMetadata {
  std::string name;
  std::vector<std::string> versions;
  std::string platform;
  std::vector<OipTensorMetadata> inputs;
  std::vector<OipTensorMetadata> outputs;
};

// The metadata of built-in model `name`, or of BatchNorm model `model`
// (nullptr for a built-in).
OipModelMetadata MetadataOf(absl::string_view name,
                            const BatchNormModel* model);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_OIP_MODELS_H_

#include "server/service/oip_models.h"

#include "absl/strings/str_cat.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

struct BuiltinModel {
  const char* name;
  NormMode mode;
};
constexpr BuiltinModel kBuiltinModels[] = {
    {"layer_norm", NormMode::kLayerNorm},
    {"rms_norm", NormMode::kRmsNorm},
    {"group_norm", NormMode::kGroupNorm},
    {"instance_norm", NormMode::kInstanceNorm},
    {"l2_norm", NormMode::kL2Norm},
    {"weight_norm", NormMode::kWeightNorm},
};

struct Datatype {
  const char* name;
  DType dtype;
};
constexpr Datatype kDatatypes[] = {
    {"FP32", DType::kFloat32},
    {"FP64", DType::kFloat64},
    {"FP16", DType::kFloat16},
    {"BF16", DType::kBFloat16},
};

}  // namespace

std::optional<NormMode> BuiltinOipModel(absl::string_view name) {
  for (const BuiltinModel& model : kBuiltinModels) {
    if (name == model.name) return model.mode;
  }
  return std::nullopt;
}

std::vector<std::string> BuiltinOipModelNames() {
  std::vector<std::string> names;
  for (const BuiltinModel& model : kBuiltinModels) names.push_back(model.name);
  return names;
}

std::optional<DType> OipDatatype(absl::string_view datatype) {
  for (const Datatype& d : kDatatypes) {
    if (datatype == d.name) return d.dtype;
  }
  return std::nullopt;
}

const char* OipDatatypeName(DType dtype) {
  for (const Datatype& d : kDatatypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "FP32";
}

absl::Status CheckOipVersion(absl::string_view version, absl::string_view model,
                             absl::string_view field) {
  if (version.empty() || version == kOipModelVersion) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      field, ": model ", QuotedForMessage(model), " has no version ",
      QuotedForMessage(version), "; its one version is \"1\""));
}

OipModelMetadata MetadataOf(absl::string_view name,
                            const BatchNormModel* model) {
  OipModelMetadata metadata;
  metadata.name = std::string(name);
  metadata.versions = {kOipModelVersion};
  metadata.platform = "normd";
  // Built-in models take any rank; a BatchNorm model [N, C, ...] with C its
  // channels, its parameters [C].
  const std::vector<int64_t> data =
      model != nullptr ? std::vector<int64_t>{-1, model->num_features}
                       : std::vector<int64_t>{-1};
  const std::vector<int64_t> params =
      model != nullptr ? std::vector<int64_t>{model->num_features}
                       : std::vector<int64_t>{-1};
  // The affine inputs the model takes: L2_NORM none, WEIGHT_NORM only its
  // g (`weight`).
  const NormMode mode =
      model != nullptr ? NormMode::kBatchNorm
                       : BuiltinOipModel(name).value_or(NormMode::kBatchNorm);
  metadata.inputs.push_back({"input", "FP32", data});
  if (mode != NormMode::kL2Norm)
    metadata.inputs.push_back({"weight", "FP32", params});
  if (mode != NormMode::kL2Norm && mode != NormMode::kWeightNorm) {
    metadata.inputs.push_back({"bias", "FP32", params});
  }
  metadata.outputs.push_back({"output", "FP32", data});
  return metadata;
}

}  // namespace normd

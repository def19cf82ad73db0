// ModelStore's limits (model_store.h): channels per model
// (--max_num_features), bytes of all models and their drift references
// (--max_model_bytes) and the number of models (--max_models), each refusal
// RESOURCE_EXHAUSTED naming the field and the flag. Called with the store's
// mutex held.
#include "absl/strings/str_cat.h"
#include "server/core/model_store.h"

namespace normd {

int64_t ModelFootprintBytes(int64_t num_features, size_t name_size) {
  // Four arrays of doubles and one Moments per channel, the name, and the
  // model's and its entry's own fields.
  constexpr int64_t kPerChannel = 4 * sizeof(double) + sizeof(Moments);
  constexpr int64_t kFixed = 256;
  return kFixed + static_cast<int64_t>(name_size) + kPerChannel * num_features;
}

absl::Status ModelStore::CheckNumFeatures(int64_t num_features,
                                          absl::string_view field) const {
  if (num_features > options_.max_num_features) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": ", num_features, " exceeds the server limit of ",
                     options_.max_num_features, " (--max_num_features)"));
  }
  return absl::OkStatus();
}

int64_t ModelStore::FootprintOf(const BatchNormModel& model) const {
  return ModelFootprintBytes(model.num_features, model.name.size()) +
         (model.reference.has_value()
              ? options_.drift_bytes_per_channel * model.num_features
              : 0);
}

int64_t ModelStore::FootprintOf(const ModelSpec& spec) const {
  return ModelFootprintBytes(spec.num_features, spec.name.size()) +
         (spec.reference_from_running
              ? options_.drift_bytes_per_channel * spec.num_features
              : 0);
}

absl::Status ModelStore::CheckLimits(int64_t num_features, int64_t footprint,
                                     int64_t freed_bytes, bool new_model,
                                     absl::string_view field) const {
  if (absl::Status s = CheckNumFeatures(num_features, field); !s.ok()) {
    return s;
  }
  return CheckBudget(footprint,
                     absl::StrCat("a model of ", num_features, " channels"),
                     freed_bytes, new_model ? 1 : 0, field);
}

absl::Status ModelStore::CheckBudget(int64_t needed_bytes,
                                     absl::string_view what,
                                     int64_t freed_bytes, int64_t new_models,
                                     absl::string_view field) const {
  const int64_t held = model_bytes_ - freed_bytes;
  if (needed_bytes > options_.max_model_bytes - held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        field, ": ", what, " takes ", needed_bytes,
        " bytes, and the models held take ", held, " of the ",
        options_.max_model_bytes, " the server allows (--max_model_bytes)"));
  }
  if (options_.max_models == 0 && new_models > 0) {
    return absl::ResourceExhaustedError(
        "model: this server keeps no BatchNorm models (--max_models=0, a "
        "replica for the stateless modes); create and fit them on the "
        "replicas that keep models");
  }
  if (new_models > options_.max_models - static_cast<int64_t>(models_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model: the server holds ", models_.size(), " models and ",
                     new_models, " more would pass its limit of ",
                     options_.max_models, " (--max_models)"));
  }
  return absl::OkStatus();
}

}  // namespace normd

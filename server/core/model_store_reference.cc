// ModelStore's drift-reference changes (see model_store.h).
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "server/core/model_store.h"

namespace normd {
namespace {

// Puts the reference `request` asks for into `model`; generation += 1.
absl::Status ApplyReference(BatchNormModel& model,
                            const ReferenceRequest& request) {
  if (absl::Status s = CheckGenerationAdd(model.generation, 1); !s.ok()) {
    return s;
  }
  DriftReference reference{.source = request.source,
                           .set_unix_nanos = absl::ToUnixNanos(absl::Now()),
                           .mean = {},
                           .var = {}};
  switch (request.source) {
    case ReferenceSource::kRunning:
      reference.mean = model.running_mean;
      reference.var = model.running_var;
      break;
    case ReferenceSource::kPooled:
      if (model.pooled.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "source: model '", model.name,
            "' has no pooled statistics yet (nothing was fitted); use "
            "RUNNING or EXPLICIT"));
      }
      reference.mean = model.PooledMean();
      reference.var = model.PooledVariance();
      break;
    default:
      reference.mean = request.mean;
      reference.var = request.var;
      break;
  }
  if (absl::Status s =
          ValidateReference(reference, model.num_features, "reference");
      !s.ok()) {
    // Only explicit arrays can fail here: their length is the model's
    // business. Name the request's field, not the model's.
    return absl::InvalidArgumentError(
        absl::StrCat(s.message().substr(sizeof("reference.") - 1), " (model '",
                     model.name, "')"));
  }
  model.reference = std::move(reference);
  model.generation += 1;
  return absl::OkStatus();
}

Mutation PutRecord(absl::string_view name, const BatchNormModel& model) {
  return {.kind = Mutation::Kind::kPut,
          .name = name,
          .model = &model,
          .batch = {},
          .running_targets = {},
          .models = {}};
}

}  // namespace

absl::StatusOr<BatchNormModel> ModelStore::SetReference(
    absl::string_view name, const ReferenceRequest& request) {
  if (absl::Status s = ValidateModelName(name, "model"); !s.ok()) return s;
  if (absl::Status s = ValidateReferenceRequest(request); !s.ok()) return s;
  return ChangeExisting(
      name,
      [&](BatchNormModel& model) { return ApplyReference(model, request); },
      [&](const BatchNormModel& changed) { return PutRecord(name, changed); });
}

absl::StatusOr<BatchNormModel> ModelStore::ClearReference(
    absl::string_view name) {
  return ChangeExisting(
      name,
      [](BatchNormModel& model) {
        if (absl::Status s = CheckGenerationAdd(model.generation, 1); !s.ok()) {
          return s;
        }
        model.reference.reset();
        model.generation += 1;
        return absl::OkStatus();
      },
      [&](const BatchNormModel& changed) { return PutRecord(name, changed); });
}

}  // namespace normd

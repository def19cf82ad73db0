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
  return ChangeCharged(
      name,
      [&](BatchNormModel& model) { return ApplyReference(model, request); },
      [&](const BatchNormModel& changed) { return PutRecord(name, changed); });
}

absl::StatusOr<BatchNormModel> ModelStore::ClearReference(
    absl::string_view name) {
  if (absl::Status s = ValidateModelName(name, "model"); !s.ok()) return s;
  return ChangeCharged(
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

absl::StatusOr<BatchNormModel> ModelStore::ChangeCharged(absl::string_view name,
                                                         Change change,
                                                         Describe describe) {
  uint64_t sequence = 0;
  BatchNormModel after;
  {
    ReaderMutexLock pause(&pause_mu_);
    // mu_ before the entry's mutex, as Delete and Put take them.
    MutexLock lock(&mu_);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    auto it = models_.find(name);
    if (it == models_.end()) return NotFound(name);
    MutexLock entry_lock(&it->second->mu);
    BatchNormModel& current = it->second->model;
    absl::StatusOr<BatchNormModel> changed = ChangedCopy(current, change);
    if (!changed.ok()) return changed.status();
    const int64_t freed = FootprintOf(current);
    const int64_t needed = FootprintOf(*changed);
    if (needed > freed) {
      if (absl::Status s = CheckBudget(
              needed,
              absl::StrCat("model '", name, "' with a drift reference (",
                           options_.drift_bytes_per_channel,
                           " bytes a channel for it and its window)"),
              freed, 0, "model");
          !s.ok()) {
        return s;
      }
    }
    sequence = Record(describe(*changed));
    current = *std::move(changed);
    model_bytes_ += needed - freed;
    after = current;
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return after;
}

}  // namespace normd

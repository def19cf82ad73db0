#include "server/core/model_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace normd {

absl::Status ModelStore::NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("model '", name, "' not found"));
}

namespace {

BatchNormModel WithoutArrays(const BatchNormModel& model) {
  BatchNormModel copy;
  copy.name = model.name;
  copy.num_features = model.num_features;
  copy.momentum = model.momentum;
  copy.cumulative_average = model.cumulative_average;
  copy.eps = model.eps;
  copy.use_pooled_statistics = model.use_pooled_statistics;
  copy.num_batches_tracked = model.num_batches_tracked;
  copy.sample_count = model.sample_count;
  copy.generation = model.generation;
  // Kept whole: a listing reports each model's drift against it.
  copy.reference = model.reference;
  return copy;
}

}  // namespace

absl::Status CheckChannels(const BatchNormModel& model, int64_t channels) {
  if (model.num_features == channels) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("input: has ", channels, " channels but model '", model.name,
                   "' has ", model.num_features, " (num_features)"));
}

ModelStore::ModelStore(ModelStoreOptions options) : options_(options) {}

absl::Status ModelStore::CheckLog() const {
  return log_ == nullptr ? absl::OkStatus() : log_->Healthy();
}

uint64_t ModelStore::Record(const Mutation& mutation) const {
  return log_ == nullptr ? 0 : log_->Append(mutation);
}

absl::Status ModelStore::WaitDurable(uint64_t sequence) const {
  if (log_ == nullptr) return absl::OkStatus();
  if (DeferDurability* scope = DeferDurability::Current()) {
    scope->Note(sequence);
    return absl::OkStatus();
  }
  return log_->WaitDurable(sequence);
}

void ModelStore::OnDurable(uint64_t sequence,
                           std::function<void(absl::Status)> done) {
  if (log_ == nullptr || sequence == 0) {
    done(absl::OkStatus());
    return;
  }
  log_->OnDurable(sequence, std::move(done));
}

absl::StatusOr<BatchNormModel> ModelStore::Create(const ModelSpec& spec) {
  // Malformed first (INVALID_ARGUMENT precedes RESOURCE_EXHAUSTED), then the
  // limits, before MakeModel allocates num_features-sized arrays.
  if (absl::Status s = ValidateModelSpec(spec); !s.ok()) return s;
  if (absl::Status s = CheckNotReservedModelName(spec.name, "name"); !s.ok()) {
    return s;
  }
  {
    ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckLimits(spec.num_features, FootprintOf(spec), 0,
                                     /*new_model=*/true, "num_features");
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<BatchNormModel> model = MakeModel(spec);
  if (!model.ok()) return model.status();
  if (absl::Status s = ValidateModel(*model); !s.ok()) return s;
  auto entry = NewEntry(*model);
  uint64_t sequence = 0;
  {
    ReaderMutexLock pause(&pause_mu_);
    MutexLock lock(&mu_);
    if (models_.contains(spec.name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: model '", spec.name, "' already exists"));
    }
    if (absl::Status s = CheckLimits(spec.num_features, FootprintOf(*model), 0,
                                     /*new_model=*/true, "num_features");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    models_.emplace(spec.name, std::move(entry));
    model_bytes_ += FootprintOf(*model);
    sequence = Record({.kind = Mutation::Kind::kCreate,
                       .name = spec.name,
                       .model = &*model,
                       .batch = {},
                       .running_targets = {},
                       .models = {}});
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return model;
}

absl::StatusOr<std::vector<BatchNormModel>> ModelStore::CreateAll(
    absl::Span<const ModelSpec> specs) {
  if (specs.empty()) {
    return absl::InvalidArgumentError("models: must name at least one model");
  }
  // Malformed first, each naming its index and model, then the limits on
  // the whole set, before any num_features-sized array is made.
  absl::flat_hash_set<absl::string_view> names;
  int64_t needed_bytes = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ModelSpec& spec = specs[i];
    const std::string field = absl::StrCat("models[", i, "]");
    absl::Status s = ValidateModelSpec(spec);
    if (s.ok()) s = CheckNotReservedModelName(spec.name, "name");
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat(field, ".", s.message(),
                                                 " (model '", spec.name, "')"));
    }
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: model '", spec.name, "' is named twice"));
    }
    needed_bytes += FootprintOf(spec);
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (absl::Status s =
            CheckNumFeatures(specs[i].num_features,
                             absl::StrCat("models[", i, "].num_features"));
        !s.ok()) {
      return s;
    }
  }
  const std::string what = absl::StrCat("the ", specs.size(), " models");
  const int64_t count = static_cast<int64_t>(specs.size());
  {
    ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckBudget(needed_bytes, what, 0, count, "models");
        !s.ok()) {
      return s;
    }
  }
  std::vector<BatchNormModel> models;
  models.reserve(specs.size());
  for (const ModelSpec& spec : specs) {
    absl::StatusOr<BatchNormModel> model = MakeModel(spec);
    if (!model.ok()) return model.status();
    if (absl::Status s = ValidateModel(*model); !s.ok()) return s;
    models.push_back(*std::move(model));
  }
  uint64_t sequence = 0;
  {
    ReaderMutexLock pause(&pause_mu_);
    MutexLock lock(&mu_);
    for (size_t i = 0; i < specs.size(); ++i) {
      if (models_.contains(specs[i].name)) {
        return absl::AlreadyExistsError(
            absl::StrCat("models[", i, "].name: model '", specs[i].name,
                         "' already exists; none of the ", specs.size(),
                         " models was created"));
      }
    }
    if (absl::Status s = CheckBudget(needed_bytes, what, 0, count, "models");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    for (const BatchNormModel& model : models) {
      auto entry = NewEntry(model);
      models_.emplace(model.name, std::move(entry));
    }
    model_bytes_ += needed_bytes;
    sequence = Record({.kind = Mutation::Kind::kCreateAll,
                       .name = {},
                       .model = nullptr,
                       .batch = {},
                       .running_targets = {},
                       .models = models});
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return models;
}

std::shared_ptr<ModelStore::Entry> ModelStore::NewEntry(BatchNormModel model) {
  auto entry = std::make_shared<Entry>();
  MutexLock entry_lock(&entry->mu);
  entry->model = std::move(model);
  return entry;
}

std::shared_ptr<ModelStore::Entry> ModelStore::Find(
    absl::string_view name) const {
  ReaderMutexLock lock(&mu_);
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

absl::StatusOr<BatchNormModel> ModelStore::ChangedCopy(
    const BatchNormModel& current, Change change) {
  BatchNormModel candidate = current;
  if (absl::Status s = change(candidate); !s.ok()) return s;
  if (absl::Status s = ValidateModel(candidate); !s.ok()) {
    return absl::OutOfRangeError(
        absl::StrCat(s.message(),
                     " after this change, so it was refused: nothing was "
                     "changed"));
  }
  return candidate;
}

absl::StatusOr<uint64_t> ModelStore::Commit(BatchNormModel& current,
                                            Change change, Describe describe) {
  absl::StatusOr<BatchNormModel> changed = ChangedCopy(current, change);
  if (!changed.ok()) return changed.status();
  const uint64_t sequence = Record(describe(*changed));
  current = *std::move(changed);
  return sequence;
}

absl::StatusOr<std::optional<std::pair<uint64_t, BatchNormModel>>>
ModelStore::CreateByChange(absl::string_view name, int64_t channels,
                           Change change, Describe describe) {
  MutexLock lock(&mu_);
  if (models_.contains(name)) return std::nullopt;
  if (absl::Status s = CheckNotReservedModelName(name, "model"); !s.ok()) {
    return s;
  }
  // The limits before the channel-sized arrays are made; a default model
  // has no reference, so it is charged ModelFootprintBytes.
  if (absl::Status s =
          CheckLimits(channels, ModelFootprintBytes(channels, name.size()), 0,
                      /*new_model=*/true, "input.shape");
      !s.ok()) {
    return s;
  }
  const BatchNormModel created = MakeDefaultModel(name, channels);
  // Nothing is stored or logged if the change is refused.
  absl::StatusOr<BatchNormModel> model = ChangedCopy(created, change);
  if (!model.ok()) return model.status();
  // The creation is a change of its own: a Delete or Reset may reach the
  // new entry right after it, and replay creates it before the step.
  Record({.kind = Mutation::Kind::kCreate,
          .name = name,
          .model = &created,
          .batch = {},
          .running_targets = {},
          .models = {}});
  const uint64_t sequence = Record(describe(*model));
  auto entry = NewEntry(*model);
  models_.emplace(std::string(name), std::move(entry));
  model_bytes_ += FootprintOf(*model);
  return std::make_optional(std::make_pair(sequence, *std::move(model)));
}

absl::StatusOr<BatchNormModel> ModelStore::Get(absl::string_view name) const {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  std::shared_ptr<Entry> entry = Find(name);
  if (entry == nullptr) return NotFound(name);
  MutexLock lock(&entry->mu);
  if (entry->deleted) return NotFound(name);
  return entry->model;
}

std::vector<BatchNormModel> ModelStore::List(bool with_arrays) const {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    ReaderMutexLock lock(&mu_);
    entries.reserve(models_.size());
    for (const auto& [name, entry] : models_) entries.push_back(entry);
  }
  std::vector<BatchNormModel> out;
  out.reserve(entries.size());
  for (const auto& entry : entries) {
    MutexLock lock(&entry->mu);
    if (entry->deleted) continue;
    out.push_back(with_arrays ? entry->model : WithoutArrays(entry->model));
  }
  std::sort(out.begin(), out.end(),
            [](const BatchNormModel& a, const BatchNormModel& b) {
              return a.name < b.name;
            });
  return out;
}

absl::Status ModelStore::Delete(absl::string_view name) {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  uint64_t sequence = 0;
  {
    ReaderMutexLock pause(&pause_mu_);
    // The entry is marked deleted and the record appended before mu_ is
    // released, so a Train that re-creates the name is logged after it.
    MutexLock lock(&mu_);
    auto it = models_.find(name);
    if (it == models_.end()) return NotFound(name);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    std::shared_ptr<Entry> entry = std::move(it->second);
    models_.erase(it);
    MutexLock entry_lock(&entry->mu);
    entry->deleted = true;
    model_bytes_ -= FootprintOf(entry->model);
    sequence = Record({.kind = Mutation::Kind::kDelete,
                       .name = name,
                       .model = nullptr,
                       .batch = {},
                       .running_targets = {},
                       .models = {}});
  }
  return WaitDurable(sequence);
}

absl::StatusOr<BatchNormModel> ModelStore::Reset(absl::string_view name) {
  return ChangeExisting(name, ResetStatistics,
                        [&](const BatchNormModel&) -> Mutation {
                          return {.kind = Mutation::Kind::kReset,
                                  .name = name,
                                  .model = nullptr,
                                  .batch = {},
                                  .running_targets = {},
                                  .models = {}};
                        });
}

absl::StatusOr<BatchNormModel> ModelStore::ChangeExisting(
    absl::string_view name, Change change, Describe describe) {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  uint64_t sequence = 0;
  BatchNormModel after;
  {
    ReaderMutexLock pause(&pause_mu_);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    while (true) {
      std::shared_ptr<Entry> entry = Find(name);
      if (entry == nullptr) return NotFound(name);
      MutexLock lock(&entry->mu);
      if (entry->deleted) continue;  // Deleted meanwhile: look again.
      absl::StatusOr<uint64_t> recorded =
          Commit(entry->model, change, describe);
      if (!recorded.ok()) return recorded.status();
      sequence = *recorded;
      after = entry->model;
      break;
    }
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return after;
}

absl::StatusOr<BatchNormModel> ModelStore::Put(BatchNormModel model,
                                               bool create_only) {
  if (absl::Status s = ValidateModel(model); !s.ok()) return s;
  const int64_t footprint = FootprintOf(model);
  uint64_t sequence = 0;
  {
    ReaderMutexLock pause(&pause_mu_);
    // mu_ is held throughout, so the name cannot appear or vanish meanwhile.
    MutexLock lock(&mu_);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    auto it = models_.find(model.name);
    if (it != models_.end()) {
      if (create_only) {
        return absl::AlreadyExistsError(absl::StrCat(
            "name: model '", model.name, "' already exists (create_only)"));
      }
      MutexLock entry_lock(&it->second->mu);
      BatchNormModel& replaced = it->second->model;
      const int64_t freed = FootprintOf(replaced);
      if (absl::Status s =
              CheckLimits(model.num_features, footprint, freed,
                          /*new_model=*/false, "model.num_features");
          !s.ok()) {
        return s;
      }
      if (absl::Status s = CheckGenerationAdd(replaced.generation, 1);
          !s.ok()) {
        return s;
      }
      model.generation = std::max(model.generation, replaced.generation + 1);
      replaced = model;
      model_bytes_ += footprint - freed;
    } else {
      if (absl::Status s = CheckNotReservedModelName(model.name, "name");
          !s.ok()) {
        return s;
      }
      if (absl::Status s =
              CheckLimits(model.num_features, footprint, 0,
                          /*new_model=*/true, "model.num_features");
          !s.ok()) {
        return s;
      }
      auto entry = NewEntry(model);
      models_.emplace(model.name, std::move(entry));
      model_bytes_ += footprint;
    }
    sequence = Record({.kind = Mutation::Kind::kPut,
                       .name = model.name,
                       .model = &model,
                       .batch = {},
                       .running_targets = {},
                       .models = {}});
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return model;
}

absl::StatusOr<BatchNormModel> ModelStore::Merge(absl::string_view name,
                                                 const BatchNormModel& source) {
  return ChangeExisting(
      name,
      [&](BatchNormModel& model) {
        return MergeModelStatistics(model, source);
      },
      [&](const BatchNormModel& merged) -> Mutation {
        return {.kind = Mutation::Kind::kPut,
                .name = name,
                .model = &merged,
                .batch = {},
                .running_targets = {},
                .models = {}};
      });
}

absl::StatusOr<BatchNormModel> ModelStore::Train(
    absl::string_view name, absl::Span<const Moments> batch) {
  return Update(
      name, static_cast<int64_t>(batch.size()),
      [&](BatchNormModel& model) { return ApplyTrainingStep(model, batch); },
      [&](const BatchNormModel&) -> Mutation {
        return {.kind = Mutation::Kind::kTrain,
                .name = name,
                .model = nullptr,
                .batch = batch,
                .running_targets = {},
                .models = {}};
      });
}

absl::StatusOr<BatchNormModel> ModelStore::TrainInstance(
    absl::string_view name, absl::Span<const Moments> pooled,
    absl::Span<const double> running_targets) {
  return Update(
      name, static_cast<int64_t>(pooled.size()),
      [&](BatchNormModel& model) -> absl::Status {
        if (model.cumulative_average) {
          return absl::FailedPreconditionError(absl::StrCat(
              "model '", name,
              "' uses cumulative_average (PyTorch momentum=None), which "
              "InstanceNorm's running statistics do not support"));
        }
        return ApplyInstanceStep(model, pooled, running_targets);
      },
      [&](const BatchNormModel&) -> Mutation {
        return {.kind = Mutation::Kind::kTrainInstance,
                .name = name,
                .model = nullptr,
                .batch = pooled,
                .running_targets = running_targets,
                .models = {}};
      });
}

absl::StatusOr<BatchNormModel> ModelStore::Update(absl::string_view name,
                                                  int64_t channels,
                                                  Change change,
                                                  Describe describe) {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  uint64_t sequence = 0;
  BatchNormModel after;
  {
    ReaderMutexLock pause(&pause_mu_);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    while (true) {
      std::shared_ptr<Entry> entry = Find(name);
      if (entry == nullptr) {
        auto created = CreateByChange(name, channels, change, describe);
        if (!created.ok()) return created.status();
        if (!created->has_value()) continue;  // Appeared meanwhile.
        sequence = (*created)->first;
        after = std::move((*created)->second);
        break;
      }
      MutexLock lock(&entry->mu);
      if (entry->deleted) continue;  // Deleted meanwhile: start afresh.
      if (absl::Status s = CheckChannels(entry->model, channels); !s.ok()) {
        return s;
      }
      absl::StatusOr<uint64_t> recorded =
          Commit(entry->model, change, describe);
      if (!recorded.ok()) return recorded.status();
      sequence = *recorded;
      after = entry->model;
      break;
    }
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return after;
}

absl::StatusOr<BatchNormModel> ModelStore::GetForEval(absl::string_view name,
                                                      int64_t channels) const {
  absl::StatusOr<BatchNormModel> model = Get(name);
  if (!model.ok()) return model.status();
  if (absl::Status s = CheckChannels(*model, channels); !s.ok()) return s;
  return model;
}

void ModelStore::Restore(BatchNormModel model) {
  std::string name = model.name;
  auto entry = NewEntry(std::move(model));
  MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) {
    MutexLock old_lock(&it->second->mu);
    model_bytes_ -= FootprintOf(it->second->model);
  }
  {
    MutexLock entry_lock(&entry->mu);
    model_bytes_ += FootprintOf(entry->model);
  }
  models_.insert_or_assign(std::move(name), std::move(entry));
}

std::vector<BatchNormModel> ModelStore::CaptureConsistent(
    absl::FunctionRef<void()> at_cut) {
  MutexLock pause(&pause_mu_);
  at_cut();
  return List(/*with_arrays=*/true);
}

int64_t ModelStore::size() const {
  ReaderMutexLock lock(&mu_);
  return static_cast<int64_t>(models_.size());
}

int64_t ModelStore::model_bytes() const {
  ReaderMutexLock lock(&mu_);
  return model_bytes_;
}

}  // namespace normd

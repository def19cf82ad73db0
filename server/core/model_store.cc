#include "server/core/model_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace normd {
namespace {

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("model '", name, "' not found"));
}

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

absl::Status ModelStore::CheckNumFeatures(int64_t num_features,
                                          absl::string_view field) const {
  if (num_features > options_.max_num_features) {
    return absl::ResourceExhaustedError(
        absl::StrCat(field, ": ", num_features, " exceeds the server limit of ",
                     options_.max_num_features, " (--max_num_features)"));
  }
  return absl::OkStatus();
}

absl::Status ModelStore::CheckNewModelLimits(int64_t num_features) const {
  if (absl::Status s = CheckNumFeatures(num_features, "num_features");
      !s.ok()) {
    return s;
  }
  if (static_cast<int64_t>(models_.size()) >= options_.max_models) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model: the server already holds ", models_.size(),
                     " models, its limit (--max_models)"));
  }
  return absl::OkStatus();
}

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

namespace {
thread_local DeferDurability* current_defer_durability = nullptr;
}  // namespace

DeferDurability::DeferDurability() : outer_(current_defer_durability) {
  current_defer_durability = this;
}

DeferDurability::~DeferDurability() {
  current_defer_durability = outer_;
  if (outer_ != nullptr) outer_->Note(sequence_);
}

DeferDurability* DeferDurability::Current() { return current_defer_durability; }

absl::StatusOr<BatchNormModel> ModelStore::Create(const ModelSpec& spec) {
  // Malformed first (INVALID_ARGUMENT precedes RESOURCE_EXHAUSTED), then the
  // limits, before MakeModel allocates num_features-sized arrays.
  if (absl::Status s = ValidateModelSpec(spec); !s.ok()) return s;
  {
    ReaderMutexLock lock(&mu_);
    if (absl::Status s = CheckNewModelLimits(spec.num_features); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<BatchNormModel> model = MakeModel(spec);
  if (!model.ok()) return model.status();
  auto entry = std::make_shared<Entry>();
  {
    MutexLock entry_lock(&entry->mu);
    entry->model = *model;
  }
  uint64_t sequence = 0;
  {
    ReaderMutexLock pause(&pause_mu_);
    MutexLock lock(&mu_);
    if (models_.contains(spec.name)) {
      return absl::AlreadyExistsError(
          absl::StrCat("name: model '", spec.name, "' already exists"));
    }
    if (absl::Status s = CheckNewModelLimits(spec.num_features); !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    models_.emplace(spec.name, std::move(entry));
    sequence = Record({.kind = Mutation::Kind::kCreate,
                       .name = spec.name,
                       .model = &*model,
                       .batch = {},
                       .running_targets = {}});
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return model;
}

std::shared_ptr<ModelStore::Entry> ModelStore::Find(
    absl::string_view name) const {
  ReaderMutexLock lock(&mu_);
  auto it = models_.find(name);
  return it == models_.end() ? nullptr : it->second;
}

absl::StatusOr<std::shared_ptr<ModelStore::Entry>> ModelStore::FindOrCreate(
    absl::string_view name, int64_t channels) {
  if (auto entry = Find(name)) return entry;
  MutexLock lock(&mu_);
  auto it = models_.find(name);
  if (it != models_.end()) return it->second;
  if (absl::Status s = CheckNewModelLimits(channels); !s.ok()) return s;
  auto entry = std::make_shared<Entry>();
  BatchNormModel model = MakeDefaultModel(name, channels);
  // The creation is a change of its own: a Delete or Reset may reach the new
  // entry before the step that created it is applied.
  Record({.kind = Mutation::Kind::kCreate,
          .name = name,
          .model = &model,
          .batch = {},
          .running_targets = {}});
  {
    MutexLock entry_lock(&entry->mu);
    entry->model = std::move(model);
  }
  models_.emplace(std::string(name), entry);
  return entry;
}

absl::StatusOr<BatchNormModel> ModelStore::Get(absl::string_view name) const {
  std::shared_ptr<Entry> entry = Find(name);
  if (entry == nullptr) return NotFound(name);
  MutexLock lock(&entry->mu);
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
    sequence = Record({.kind = Mutation::Kind::kDelete,
                       .name = name,
                       .model = nullptr,
                       .batch = {},
                       .running_targets = {}});
  }
  return WaitDurable(sequence);
}

absl::StatusOr<BatchNormModel> ModelStore::Reset(absl::string_view name) {
  return ChangeExisting(name,
                        [&](BatchNormModel& model) -> absl::StatusOr<uint64_t> {
                          ResetStatistics(model);
                          return Record({.kind = Mutation::Kind::kReset,
                                         .name = name,
                                         .model = nullptr,
                                         .batch = {},
                                         .running_targets = {}});
                        });
}

absl::StatusOr<BatchNormModel> ModelStore::ChangeExisting(
    absl::string_view name,
    absl::FunctionRef<absl::StatusOr<uint64_t>(BatchNormModel&)> apply) {
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
      absl::StatusOr<uint64_t> recorded = apply(entry->model);
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
      model.generation =
          std::max(model.generation, it->second->model.generation + 1);
      it->second->model = model;
    } else {
      if (absl::Status s = CheckNewModelLimits(model.num_features); !s.ok()) {
        return s;
      }
      auto entry = std::make_shared<Entry>();
      {
        MutexLock entry_lock(&entry->mu);
        entry->model = model;
      }
      models_.emplace(model.name, std::move(entry));
    }
    sequence = Record({.kind = Mutation::Kind::kPut,
                       .name = model.name,
                       .model = &model,
                       .batch = {},
                       .running_targets = {}});
  }
  if (absl::Status s = WaitDurable(sequence); !s.ok()) return s;
  return model;
}

absl::StatusOr<BatchNormModel> ModelStore::Merge(absl::string_view name,
                                                 const BatchNormModel& source) {
  return ChangeExisting(
      name, [&](BatchNormModel& model) -> absl::StatusOr<uint64_t> {
        // A refusal leaves the model untouched (MergeModelStatistics checks
        // before it changes anything).
        if (absl::Status s = MergeModelStatistics(model, source); !s.ok()) {
          return s;
        }
        return Record({.kind = Mutation::Kind::kPut,
                       .name = name,
                       .model = &model,
                       .batch = {},
                       .running_targets = {}});
      });
}

absl::StatusOr<BatchNormModel> ModelStore::Train(
    absl::string_view name, absl::Span<const Moments> batch) {
  return Update(name, static_cast<int64_t>(batch.size()),
                [&](BatchNormModel& model) -> absl::StatusOr<uint64_t> {
                  ApplyTrainingStep(model, batch);
                  return Record({.kind = Mutation::Kind::kTrain,
                                 .name = name,
                                 .model = nullptr,
                                 .batch = batch,
                                 .running_targets = {}});
                });
}

absl::StatusOr<BatchNormModel> ModelStore::TrainInstance(
    absl::string_view name, absl::Span<const Moments> pooled,
    absl::Span<const double> running_targets) {
  return Update(
      name, static_cast<int64_t>(pooled.size()),
      [&](BatchNormModel& model) -> absl::StatusOr<uint64_t> {
        if (model.cumulative_average) {
          return absl::FailedPreconditionError(absl::StrCat(
              "model '", name,
              "' uses cumulative_average (PyTorch momentum=None), which "
              "InstanceNorm's running statistics do not support"));
        }
        ApplyInstanceStep(model, pooled, running_targets);
        return Record({.kind = Mutation::Kind::kTrainInstance,
                       .name = name,
                       .model = nullptr,
                       .batch = pooled,
                       .running_targets = running_targets});
      });
}

absl::StatusOr<BatchNormModel> ModelStore::Update(
    absl::string_view name, int64_t channels,
    absl::FunctionRef<absl::StatusOr<uint64_t>(BatchNormModel&)> apply) {
  uint64_t sequence = 0;
  BatchNormModel after;
  {
    ReaderMutexLock pause(&pause_mu_);
    if (absl::Status s = CheckLog(); !s.ok()) return s;
    while (true) {
      absl::StatusOr<std::shared_ptr<Entry>> entry =
          FindOrCreate(name, channels);
      if (!entry.ok()) return entry.status();
      MutexLock lock(&(*entry)->mu);
      if ((*entry)->deleted) continue;  // Deleted meanwhile: start afresh.
      BatchNormModel& model = (*entry)->model;
      if (absl::Status s = CheckChannels(model, channels); !s.ok()) return s;
      absl::StatusOr<uint64_t> recorded = apply(model);
      if (!recorded.ok()) return recorded.status();
      sequence = *recorded;
      after = model;
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
  auto entry = std::make_shared<Entry>();
  std::string name = model.name;
  {
    MutexLock entry_lock(&entry->mu);
    entry->model = std::move(model);
  }
  MutexLock lock(&mu_);
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

}  // namespace normd

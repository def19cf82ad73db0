// The in-memory store of BatchNorm models.
//
// Thread-safe. A store-wide mutex guards only the name -> entry map; every
// model has its own mutex, so work on different models proceeds in parallel
// and updates of one model are serialized (none is ever lost). Callers do the
// expensive work (reductions, outputs) outside any lock and hand the store
// only the finished per-channel moments. Every method returns copies.
//
// With a MutationLog attached, every change is appended to it under the locks
// that order the change (so the log's order is the applied order of each
// model) and the changing call returns only once the record is durable.
// Changes hold a shared "pause" lock while they apply and append;
// CaptureConsistent takes it exclusively to see a state that is exactly the
// log up to some record.
#ifndef NORMD_SERVER_CORE_MODEL_STORE_H_
#define NORMD_SERVER_CORE_MODEL_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/model.h"
#include "server/core/mutation_log.h"
#include "server/core/sync.h"

namespace normd {

// Limits of a ModelStore.
struct ModelStoreOptions {
  int64_t max_models = 10000;
  int64_t max_num_features = 1 << 20;
};

class ModelStore {
 public:
  explicit ModelStore(ModelStoreOptions options = {});
  ModelStore(const ModelStore&) = delete;
  ModelStore& operator=(const ModelStore&) = delete;

  // Creates a model from a validated spec. ALREADY_EXISTS if the name is
  // taken; RESOURCE_EXHAUSTED beyond max_models or max_num_features.
  absl::StatusOr<BatchNormModel> Create(const ModelSpec& spec);

  // Stores `model` (already validated, e.g. by MakeModelFromState) under
  // its name, replacing the model of that name unless `create_only`
  // (ALREADY_EXISTS then). A replacement's generation is at least the
  // replaced one's + 1. RESOURCE_EXHAUSTED when a new model would exceed a
  // limit. Returns the model as stored.
  absl::StatusOr<BatchNormModel> Put(BatchNormModel model, bool create_only);

  // Folds `source` into model `name` (see MergeModelStatistics). NOT_FOUND
  // if absent; FAILED_PRECONDITION (model untouched) if they do not match.
  absl::StatusOr<BatchNormModel> Merge(absl::string_view name,
                                       const BatchNormModel& source);

  // NOT_FOUND if absent.
  absl::StatusOr<BatchNormModel> Get(absl::string_view name) const;

  // Every model sorted by name; per-channel arrays left empty unless
  // `with_arrays`.
  std::vector<BatchNormModel> List(bool with_arrays = false) const;

  // NOT_FOUND if absent.
  absl::Status Delete(absl::string_view name);

  // Resets the statistics (see ResetStatistics). NOT_FOUND if absent.
  absl::StatusOr<BatchNormModel> Reset(absl::string_view name);

  // Applies one training step with per-channel batch moments, creating the
  // model with defaults if absent. FAILED_PRECONDITION (model untouched) if
  // the model has a different channel count; RESOURCE_EXHAUSTED when a new
  // model would exceed a limit. Returns the model after the step.
  absl::StatusOr<BatchNormModel> Train(absl::string_view name,
                                       absl::Span<const Moments> batch);

  // Applies one InstanceNorm training step (see ApplyInstanceStep), creating
  // the model with defaults if absent. FAILED_PRECONDITION (model untouched)
  // for a different channel count or a cumulative_average model (PyTorch's
  // InstanceNorm needs a momentum); RESOURCE_EXHAUSTED as Train.
  absl::StatusOr<BatchNormModel> TrainInstance(
      absl::string_view name, absl::Span<const Moments> pooled,
      absl::Span<const double> running_targets);

  // The model for an eval step on `channels` channels: NOT_FOUND if absent,
  // FAILED_PRECONDITION if its channel count differs.
  absl::StatusOr<BatchNormModel> GetForEval(absl::string_view name,
                                            int64_t channels) const;

  // RESOURCE_EXHAUSTED (naming `field`) when a model of `num_features`
  // channels exceeds max_num_features. For callers that must check before
  // they build such a model.
  absl::Status CheckNumFeatures(int64_t num_features,
                                absl::string_view field) const;

  // Number of models.
  int64_t size() const;

  // Attaches the log that records every later change (nullptr: none). Call
  // before the store is shared between threads.
  void SetMutationLog(MutationLog* log) { log_ = log; }

  // Calls `done` once change `sequence` (from a DeferDurability scope) is
  // durable; at once with OK for sequence 0 or without a log. See
  // MutationLog::OnDurable.
  void OnDurable(uint64_t sequence, std::function<void(absl::Status)> done);

  // Inserts or replaces `model` as is: no limits, not logged. For loading a
  // snapshot.
  void Restore(BatchNormModel model);

  // Pauses every change, calls `at_cut` (e.g. to rotate the log) and returns
  // every model with its arrays as of that moment; changes resume on return.
  std::vector<BatchNormModel> CaptureConsistent(
      absl::FunctionRef<void()> at_cut);

 private:
  // One model and the mutex that serializes its changes. `deleted` is set
  // (under `mu`) when the entry leaves the map, so that an update that
  // looked it up just before retries on a fresh entry instead of being lost.
  struct Entry {
    mutable Mutex mu;
    BatchNormModel model ABSL_GUARDED_BY(mu);
    bool deleted ABSL_GUARDED_BY(mu) = false;
  };

  std::shared_ptr<Entry> Find(absl::string_view name) const;
  // The common part of the training steps: finds or creates the model,
  // checks its channel count and, under its lock, calls `apply`, which
  // changes it (or refuses with an error, changing nothing) and returns the
  // sequence number of its log record; then waits for durability.
  absl::StatusOr<BatchNormModel> Update(
      absl::string_view name, int64_t channels,
      absl::FunctionRef<absl::StatusOr<uint64_t>(BatchNormModel&)> apply);
  // The common part of Reset and Merge: finds the model (NOT_FOUND if
  // absent) and, under its lock, calls `apply`, which changes it (or
  // refuses with an error, changing nothing) and returns the sequence number
  // of its log record; then waits for durability.
  absl::StatusOr<BatchNormModel> ChangeExisting(
      absl::string_view name,
      absl::FunctionRef<absl::StatusOr<uint64_t>(BatchNormModel&)> apply);
  // The entry of `name`, created (and its creation logged) with defaults and
  // `channels` channels if absent. Requires pause_mu_ held shared.
  absl::StatusOr<std::shared_ptr<Entry>> FindOrCreate(absl::string_view name,
                                                      int64_t channels);
  absl::Status CheckNewModelLimits(int64_t num_features) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The log's health (OK without a log), checked before a change applies.
  absl::Status CheckLog() const;
  // Appends `mutation` to the log; 0 without a log.
  uint64_t Record(const Mutation& mutation) const;
  // Waits until record `sequence` is durable (OK without a log), or notes it
  // in the thread's DeferDurability scope.
  absl::Status WaitDurable(uint64_t sequence) const;

  const ModelStoreOptions options_;
  MutationLog* log_ = nullptr;
  // Held shared by every change (apply + append), exclusively by
  // CaptureConsistent. Acquired before mu_ and any entry's mu.
  Mutex pause_mu_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> models_
      ABSL_GUARDED_BY(mu_);
};

// FAILED_PRECONDITION unless the model has `channels` channels.
absl::Status CheckChannels(const BatchNormModel& model, int64_t channels);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MODEL_STORE_H_

// The in-memory store of BatchNorm models.
//
// Every model the store takes in (created, imported, merged into, trained,
// reset) passes ValidateModel before it is stored or logged: a change whose
// result would not validate, or would overflow a counter, is refused with
// OUT_OF_RANGE naming the field, and nothing changes. So whatever the store
// holds, recovery can read back.
//
// Every method that takes a model's name checks it first (ValidateModelName):
// INVALID_ARGUMENT naming `name` for a malformed one, before NOT_FOUND or
// any other answer.
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
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/drift_window.h"
#include "server/core/model.h"
#include "server/core/mutation_log.h"
#include "server/core/sync.h"

namespace normd {

// Limits of a ModelStore (the server's --max_models, --max_num_features and
// --max_model_bytes).
struct ModelStoreOptions {
  int64_t max_models = 10000;
  int64_t max_num_features = 65536;
  int64_t max_model_bytes = int64_t{1} << 30;
  // What a model with a drift reference is charged per channel on top of
  // ModelFootprintBytes (DriftBytesPerChannel: the reference and its
  // window in the Engine's DriftMonitor), so that max_model_bytes bounds
  // them too. The Engine sets it from its DriftOptions.
  int64_t drift_bytes_per_channel =
      DriftBytesPerChannel(DriftOptions{}.buckets);
};

// The bytes a model of `num_features` channels named `name_size` bytes is
// charged against max_model_bytes: its four per-channel arrays and its
// pooled statistics, whether or not anything was fitted yet, plus a fixed
// overhead. A model is charged this from creation, so that a training step
// never fails for want of budget.
int64_t ModelFootprintBytes(int64_t num_features, size_t name_size);

class ModelStore {
 public:
  explicit ModelStore(ModelStoreOptions options = {});
  ModelStore(const ModelStore&) = delete;
  ModelStore& operator=(const ModelStore&) = delete;

  // Creates a model from a spec (INVALID_ARGUMENT naming the field unless it
  // is valid). ALREADY_EXISTS if the name is taken; RESOURCE_EXHAUSTED naming
  // the flag beyond max_models, max_num_features or max_model_bytes.
  absl::StatusOr<BatchNormModel> Create(const ModelSpec& spec);

  // Creates every model of `specs`, or none: INVALID_ARGUMENT naming
  // "models[i]" and the model if one is malformed or two share a name,
  // ALREADY_EXISTS naming the first that exists, RESOURCE_EXHAUSTED if
  // together they pass a limit. One log record holds them all, so recovery
  // sees all of them or none. Returns the models as created, in order.
  absl::StatusOr<std::vector<BatchNormModel>> CreateAll(
      absl::Span<const ModelSpec> specs);

  // Stores `model` (e.g. from MakeModelFromState; INVALID_ARGUMENT unless
  // it passes ValidateModel) under its name, replacing the model of that name
  // unless `create_only` (ALREADY_EXISTS then). A replacement's generation is
  // at least the replaced one's + 1 (OUT_OF_RANGE if that overflows).
  // RESOURCE_EXHAUSTED when the model would exceed a limit. Returns the model
  // as stored.
  absl::StatusOr<BatchNormModel> Put(BatchNormModel model, bool create_only);

  // Folds `source` into model `name` (see MergeModelStatistics). NOT_FOUND
  // if absent; FAILED_PRECONDITION (model untouched) if they do not match;
  // OUT_OF_RANGE (model untouched) if the result would overflow.
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

  // Sets model `name`'s drift reference (ValidateReferenceRequest first,
  // then NOT_FOUND if absent): its running or pooled statistics as they are
  // now (FAILED_PRECONDITION for pooled ones when nothing was fitted), or the
  // explicit arrays (INVALID_ARGUMENT unless num_features long); the set time
  // is now. A logged change: generation += 1. A reference is charged to
  // max_model_bytes (drift_bytes_per_channel): RESOURCE_EXHAUSTED naming
  // the flag, and nothing changed, when it does not fit.
  absl::StatusOr<BatchNormModel> SetReference(absl::string_view name,
                                              const ReferenceRequest& request);

  // Removes model `name`'s drift reference (NOT_FOUND if absent); a logged
  // change, generation += 1, even when it had none.
  absl::StatusOr<BatchNormModel> ClearReference(absl::string_view name);

  // Applies one training step with per-channel batch moments, creating the
  // model with defaults if absent (only if the step succeeds). FAILED_
  // PRECONDITION (model untouched) if the model has a different channel
  // count; OUT_OF_RANGE (untouched) if the result would overflow;
  // RESOURCE_EXHAUSTED when a new model would exceed a limit. Returns the
  // model after the step.
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

  // RESOURCE_EXHAUSTED (naming `field` and the flag) when a model of
  // `num_features` channels exceeds max_num_features. For callers that must
  // check before they build such a model (a few bytes of request can ask for
  // any number of channels); the byte budget is checked when it is stored.
  absl::Status CheckNumFeatures(int64_t num_features,
                                absl::string_view field) const;

  // Number of models.
  int64_t size() const;

  // Bytes charged to the models held (see ModelFootprintBytes).
  int64_t model_bytes() const;

  // Attaches the log that records every later change (nullptr: none). Call
  // before the store is shared between threads.
  void SetMutationLog(MutationLog* log) { log_ = log; }

  // Calls `done` once change `sequence` (from a DeferDurability scope) is
  // durable; at once with OK for sequence 0 or without a log. See
  // MutationLog::OnDurable.
  void OnDurable(uint64_t sequence, std::function<void(absl::Status)> done);

  // Inserts or replaces `model` (already validated) as is: no limits, not
  // logged. For loading a snapshot.
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

  // A change of one model: edits the copy it is given (or refuses with an
  // error), and the record that logs the edited model.
  using Change = absl::FunctionRef<absl::Status(BatchNormModel&)>;
  using Describe = absl::FunctionRef<Mutation(const BatchNormModel&)>;

  // NOT_FOUND naming model `name`.
  static absl::Status NotFound(absl::string_view name);
  std::shared_ptr<Entry> Find(absl::string_view name) const;
  // A fresh entry holding `model`, not yet in the map.
  static std::shared_ptr<Entry> NewEntry(BatchNormModel model);
  // A copy of `current` with `change` applied, if the result passes
  // ValidateModel (OUT_OF_RANGE naming the field otherwise).
  static absl::StatusOr<BatchNormModel> ChangedCopy(
      const BatchNormModel& current, Change change);
  // Applies `change` to a copy of `current`, checks the result
  // (ValidateModel; OUT_OF_RANGE naming the field), logs it and only then
  // stores it into `current`; returns the log sequence number. On any error
  // `current` and the log are untouched. Requires current's entry mutex.
  absl::StatusOr<uint64_t> Commit(BatchNormModel& current, Change change,
                                  Describe describe);
  // The common part of the training steps: finds the model (or creates it
  // with defaults and `channels` channels, see CreateByChange), checks its
  // channel count and commits `change`; then waits for durability.
  absl::StatusOr<BatchNormModel> Update(absl::string_view name,
                                        int64_t channels, Change change,
                                        Describe describe);
  // For Update on a name that was absent: under mu_, a default model with
  // `channels` channels gets `change`; only if that succeeds is the model
  // stored and its creation and the change logged. nullopt if the name
  // appeared meanwhile (the caller looks again). Requires pause_mu_ shared.
  absl::StatusOr<std::optional<std::pair<uint64_t, BatchNormModel>>>
  CreateByChange(absl::string_view name, int64_t channels, Change change,
                 Describe describe);
  // The common part of Reset and Merge: finds the model (NOT_FOUND if
  // absent) and commits `change`; then waits for durability.
  absl::StatusOr<BatchNormModel> ChangeExisting(absl::string_view name,
                                                Change change,
                                                Describe describe);
  // The reference changes: like ChangeExisting, but under mu_, so that the
  // change of the model's charge (FootprintOf) is checked against
  // max_model_bytes and booked with it.
  absl::StatusOr<BatchNormModel> ChangeCharged(absl::string_view name,
                                               Change change,
                                               Describe describe);
  // The bytes `model` is charged: ModelFootprintBytes, plus
  // drift_bytes_per_channel per channel with a reference.
  int64_t FootprintOf(const BatchNormModel& model) const;
  // FootprintOf the model `spec` makes.
  int64_t FootprintOf(const ModelSpec& spec) const;
  // RESOURCE_EXHAUSTED (naming the flag) unless a model of `num_features`
  // channels charged `footprint` bytes fits max_num_features and, in place
  // of models charged `freed_bytes`, max_model_bytes; also max_models when
  // `new_model`. Messages start with `field`.
  absl::Status CheckLimits(int64_t num_features, int64_t footprint,
                           int64_t freed_bytes, bool new_model,
                           absl::string_view field) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED (naming the flag) unless `needed_bytes` more, in
  // place of models charged `freed_bytes`, fit max_model_bytes and
  // `new_models` more fit max_models. Messages start with `field` and say
  // that `what` takes the bytes.
  absl::Status CheckBudget(int64_t needed_bytes, absl::string_view what,
                           int64_t freed_bytes, int64_t new_models,
                           absl::string_view field) const
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
  int64_t model_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

// FAILED_PRECONDITION unless the model has `channels` channels.
absl::Status CheckChannels(const BatchNormModel& model, int64_t channels);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MODEL_STORE_H_

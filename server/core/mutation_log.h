// The hook through which a ModelStore makes its changes durable (see
// server/state/durable_state.h). The core only defines the interface: it
// knows no files.
#ifndef NORMD_SERVER_CORE_MUTATION_LOG_H_
#define NORMD_SERVER_CORE_MUTATION_LOG_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/model.h"
#include "server/core/moments.h"

namespace normd {

// One change of a ModelStore, as applied. Views only: valid during Append.
struct Mutation {
  enum class Kind : uint8_t {
    kCreate = 1,
    kTrain = 2,
    kDelete = 3,
    kReset = 4,
    kTrainInstance = 5,
    kPut = 6,
    kCreateAll = 7
  };
  Kind kind = Kind::kCreate;
  absl::string_view name;
  // kCreate: the model exactly as created (generation included); kPut: the
  // model's whole state after an import or a merge, replacing any model of
  // that name.
  const BatchNormModel* model = nullptr;
  // kTrain: the batch's per-channel moments; replaying ModelStore::Train with
  // them reproduces the step bit for bit (the model is created with defaults
  // when absent).
  absl::Span<const Moments> batch;
  // kTrainInstance: `batch` holds the pooled per-channel moments and
  // running_targets the 2C targets of ModelStore::TrainInstance.
  absl::Span<const double> running_targets;
  // kCreateAll: every model created at once, exactly as created (`name` is
  // empty); replay creates all of them.
  absl::Span<const BatchNormModel> models;
};

// Receives every change of a ModelStore in the order the store applied it.
// Implementations are thread-safe.
class MutationLog {
 public:
  virtual ~MutationLog() = default;

  // OK while the log accepts changes; the store checks it before applying
  // one, so that a broken log refuses changes instead of losing them.
  virtual absl::Status Healthy() = 0;

  // Records `mutation`, just applied in memory, and returns its sequence
  // number. Called under the locks that order the change, so it must not do
  // I/O: it only queues the record.
  virtual uint64_t Append(const Mutation& mutation) = 0;

  // Blocks until every record up to `sequence` is durable (group commit:
  // one sync covers every record queued before it). An error means the
  // change may be lost on a crash.
  virtual absl::Status WaitDurable(uint64_t sequence) = 0;

  // Calls `done` once record `sequence` is durable (or with the error that
  // stops it ever being), from the log's own thread or, if that is known
  // already, from this one. `done` must not block.
  virtual void OnDurable(uint64_t sequence,
                         std::function<void(absl::Status)> done) = 0;
};

// While a DeferDurability is alive on a thread, the ModelStore changes that
// thread makes return as soon as they are applied and logged, without
// waiting for durability; the scope collects the last sequence number to
// wait for, so that the caller can wait once, asynchronously (see
// ModelStore::OnDurable), before acknowledging. Scopes nest; not shared
// between threads.
class DeferDurability {
 public:
  DeferDurability();
  ~DeferDurability();
  DeferDurability(const DeferDurability&) = delete;
  DeferDurability& operator=(const DeferDurability&) = delete;

  // The highest sequence number a change made in this scope must wait for;
  // 0 if none.
  uint64_t sequence() const { return sequence_; }

  // The innermost scope on this thread, or nullptr.
  static DeferDurability* Current();
  void Note(uint64_t sequence) {
    if (sequence > sequence_) sequence_ = sequence;
  }

 private:
  DeferDurability* const outer_;
  uint64_t sequence_ = 0;
};

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MUTATION_LOG_H_

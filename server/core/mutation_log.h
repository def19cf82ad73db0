// The hook through which a ModelStore makes its changes durable (see
// server/state/durable_state.h). The core only defines the interface: it
// knows no files.
#ifndef NORMD_SERVER_CORE_MUTATION_LOG_H_
#define NORMD_SERVER_CORE_MUTATION_LOG_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/model.h"
#include "server/core/moments.h"

namespace normd {

// One change of a ModelStore, as applied. Views only: valid during Append.
struct Mutation {
  enum class Kind : uint8_t { kCreate = 1, kTrain = 2, kDelete = 3, kReset = 4 };
  Kind kind = Kind::kCreate;
  absl::string_view name;
  // kCreate: the model exactly as created (generation included).
  const BatchNormModel* model = nullptr;
  // kTrain: the batch's per-channel moments; replaying ModelStore::Train with
  // them reproduces the step bit for bit (the model is created with defaults
  // when absent).
  absl::Span<const Moments> batch;
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
};

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MUTATION_LOG_H_

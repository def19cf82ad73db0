// Per-model counts and times of the Open Inference Protocol's infer calls,
// as Triton's statistics extension reports them: successes and failures with
// their total time, and when the last one ended. Only models that exist are
// recorded (a call naming an unknown model is not), and entries of deleted
// models are dropped once they pass a bound, so that the table stays the
// size of the model store.
//
// Thread-safe (one mutex around the table; each record is a hash lookup).
#ifndef NORMD_SERVER_SERVICE_MODEL_STATISTICS_H_
#define NORMD_SERVER_SERVICE_MODEL_STATISTICS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"
#include "server/core/sync.h"

namespace normd {

struct InferStatistics {
  int64_t success_count = 0;
  int64_t success_ns = 0;
  int64_t fail_count = 0;
  int64_t fail_ns = 0;
  int64_t last_inference_ms = 0;  // Unix milliseconds; 0: never.
};

class ModelStatistics {
 public:
  // Records one call of `model` that took `ns`. When the table holds more
  // than `bound` entries, those for which `exists` is false are dropped
  // first.
  void Record(absl::string_view model, bool ok, int64_t ns, int64_t bound,
              absl::FunctionRef<bool(absl::string_view)> exists);
  // The statistics of `model` (zeros if none were recorded).
  InferStatistics Get(absl::string_view model) const;

 private:
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, InferStatistics> models_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_MODEL_STATISTICS_H_

// Drift monitoring's live part: one observation window per model whose
// inputs are observed, and the sampling of requests.
//
// Thread-safe: a mutex guards the name -> window map, and each window has
// its own, so observations of different models proceed in parallel and
// those of one model are merged one at a time. Windows live in memory only:
// a restart starts them empty.
#ifndef NORMD_SERVER_CORE_DRIFT_MONITOR_H_
#define NORMD_SERVER_CORE_DRIFT_MONITOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/drift_window.h"
#include "server/core/moments.h"
#include "server/core/sync.h"

namespace normd {

class DriftMonitor {
 public:
  // Nanoseconds since the Unix epoch.
  using Clock = std::function<int64_t()>;

  // `clock`: the wall clock unless given (tests move time by hand).
  explicit DriftMonitor(DriftOptions options = {}, Clock clock = nullptr);
  DriftMonitor(const DriftMonitor&) = delete;
  DriftMonitor& operator=(const DriftMonitor&) = delete;

  // Whether to observe this request of model `name`: true for its first
  // request and then every sample_every-th (counted per model).
  bool ShouldObserve(absl::string_view name);

  // Adds one input's per-channel moments (all of one count) to model
  // `name`'s window, now. A window of another channel count (the model
  // was replaced by one of other shape) starts over.
  void Observe(absl::string_view name, absl::Span<const Moments> moments);

  // Model `name`'s window now, merged per channel (DriftWindow::Merged);
  // `channels` zero moments when nothing of that shape was observed.
  std::vector<Moments> Window(absl::string_view name, int64_t channels) const;

  // Empties model `name`'s window (ResetModel).
  void Clear(absl::string_view name);
  // Drops model `name`'s window and its sampling count (DeleteModel).
  void Forget(absl::string_view name);

  const DriftOptions& options() const { return options_; }
  int64_t Now() const { return clock_(); }

 private:
  // One model's window and sampling count.
  struct Slot {
    mutable Mutex mu;
    std::optional<DriftWindow> window ABSL_GUARDED_BY(mu);
    int64_t requests ABSL_GUARDED_BY(mu) = 0;
  };

  std::shared_ptr<Slot> Find(absl::string_view name) const;
  std::shared_ptr<Slot> FindOrAdd(absl::string_view name);

  const DriftOptions options_;
  const Clock clock_;
  mutable Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Slot>> slots_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace normd

#endif  // NORMD_SERVER_CORE_DRIFT_MONITOR_H_

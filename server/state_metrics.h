// Metrics of the durable state (--state_dir): write-ahead log syncs and the
// records each covered (group commit shows as records/syncs > 1), snapshots,
// and whether changes can still be made durable. Thread-safe
// (prometheus-cpp metrics are atomic).
#ifndef NORMD_SERVER_STATE_METRICS_H_
#define NORMD_SERVER_STATE_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "server/state/durable_state.h"

namespace normd {

class StateMetrics final : public state::DurabilityObserver {
 public:
  explicit StateMetrics(prometheus::Registry& registry);
  void OnSync(int64_t records, int64_t bytes, double seconds) override;
  void OnSnapshot(int64_t bytes, double seconds) override;
  void OnFailure(const absl::Status& error) override;

 private:
  prometheus::Gauge* writable_ = nullptr;
  prometheus::Counter* syncs_ = nullptr;
  prometheus::Counter* records_ = nullptr;
  prometheus::Counter* bytes_ = nullptr;
  prometheus::Histogram* sync_seconds_ = nullptr;
  prometheus::Counter* snapshots_ = nullptr;
  prometheus::Gauge* snapshot_bytes_ = nullptr;
  prometheus::Gauge* snapshot_seconds_ = nullptr;
};

}  // namespace normd

#endif  // NORMD_SERVER_STATE_METRICS_H_

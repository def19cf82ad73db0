#include "server/state_metrics.h"

#include "server/service/service_metrics.h"

namespace normd {

StateMetrics::StateMetrics(prometheus::Registry& registry) {
  const auto counter = [&](const char* name, const char* help) {
    return &AddCounter(registry, name, help);
  };
  const auto gauge = [&](const char* name, const char* help) {
    return &AddGauge(registry, name, help);
  };
  syncs_ = counter("normd_wal_syncs_total",
                   "Write-ahead log fdatasyncs (one per group commit).");
  records_ = counter("normd_wal_records_total",
                     "Model changes made durable in the write-ahead log.");
  bytes_ =
      counter("normd_wal_bytes_total", "Bytes written to the write-ahead log.");
  sync_seconds_ =
      &prometheus::BuildHistogram()
           .Name("normd_wal_sync_seconds")
           .Help("Time to write and fdatasync one group commit.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                        0.01, 0.025, 0.05, 0.1, 0.25, 1});
  snapshots_ = counter("normd_snapshots_total", "State snapshots written.");
  snapshot_bytes_ =
      gauge("normd_snapshot_bytes", "Size of the last snapshot written.");
  snapshot_seconds_ = gauge("normd_snapshot_seconds",
                            "Time the last snapshot took, in seconds.");
  writable_ = gauge("normd_state_writable",
                    "1 while model changes can be made durable; 0 once "
                    "writing the state failed (changes are refused).");
  writable_->Set(1);
}

void StateMetrics::OnFailure(const absl::Status& error) { writable_->Set(0); }

void StateMetrics::OnSync(int64_t records, int64_t bytes, double seconds) {
  syncs_->Increment();
  records_->Increment(static_cast<double>(records));
  bytes_->Increment(static_cast<double>(bytes));
  sync_seconds_->Observe(seconds);
}

void StateMetrics::OnSnapshot(int64_t bytes, double seconds) {
  snapshots_->Increment();
  snapshot_bytes_->Set(static_cast<double>(bytes));
  snapshot_seconds_->Set(seconds);
}

}  // namespace normd

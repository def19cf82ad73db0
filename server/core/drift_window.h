// The observation window of drift monitoring: the per-channel moments of a
// model's recent inputs, in time buckets that expire one at a time.
#ifndef NORMD_SERVER_CORE_DRIFT_WINDOW_H_
#define NORMD_SERVER_CORE_DRIFT_WINDOW_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "server/core/moments.h"

namespace normd {

// How drift is observed and judged (the server's --drift_* flags).
struct DriftOptions {
  int64_t buckets = 10;         // --drift_buckets
  int64_t bucket_seconds = 60;  // --drift_bucket_seconds
  int64_t sample_every = 1;     // --drift_sample_every
  int64_t min_samples = 1000;   // --drift_min_samples
  double threshold = 0.1;       // --drift_threshold
};

// The bytes per channel a model with a drift reference holds for drift: the
// reference's mean and variance, and a window of `buckets` buckets (a
// Moments each). What ModelStore charges it (drift_bytes_per_channel).
constexpr int64_t DriftBytesPerChannel(int64_t buckets) {
  return 2 * static_cast<int64_t>(sizeof(double)) +
         (buckets > 1 ? buckets : 1) * static_cast<int64_t>(sizeof(Moments));
}

// `buckets` buckets of `bucket_seconds` each: bucket k holds the Chan merge
// of every observation made in [k, k + 1) x bucket_seconds since the epoch,
// and the window at time t is the buckets k > t / bucket_seconds - buckets.
// A value type, not thread-safe: DriftMonitor guards each one.
class DriftWindow {
 public:
  DriftWindow(int64_t channels, int64_t buckets, int64_t bucket_seconds);

  // Merges per-channel `moments` (one per channel) into the bucket of
  // `now_nanos`, replacing whatever expired bucket held its slot.
  void Add(absl::Span<const Moments> moments, int64_t now_nanos);

  // The window at `now_nanos`: every live bucket merged per channel, the
  // oldest first (so the result depends only on the buckets, not on when it
  // is asked). Counts 0 when nothing was observed.
  std::vector<Moments> Merged(int64_t now_nanos) const;

  int64_t channels() const { return channels_; }

 private:
  struct Bucket {
    int64_t index = -1;  // Time / bucket length; -1 while unused.
    std::vector<Moments> moments;
  };

  int64_t IndexAt(int64_t now_nanos) const;

  const int64_t channels_;
  const int64_t bucket_nanos_;
  std::vector<Bucket> ring_;  // Bucket k sits at k % buckets.
};

}  // namespace normd

#endif  // NORMD_SERVER_CORE_DRIFT_WINDOW_H_

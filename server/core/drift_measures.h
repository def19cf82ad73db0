// How far a model's observed inputs are from its drift reference, per
// channel and in summary. Pure functions on values.
#ifndef NORMD_SERVER_CORE_DRIFT_MEASURES_H_
#define NORMD_SERVER_CORE_DRIFT_MEASURES_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/types/span.h"
#include "server/core/drift_reference.h"
#include "server/core/drift_window.h"
#include "server/core/moments.h"

namespace normd {

// The measures of a window that holds enough samples.
struct DriftMeasures {
  double kl_max = 0;
  double kl_mean = 0;
  double shift_max = 0;
  int64_t channels_drifted = 0;
  std::vector<double> kl;     // [C]
  std::vector<double> shift;  // [C]
};

// A model's drift: its reference's provenance, the window's size, and the
// measures, absent while the window holds fewer than min_samples values per
// channel.
struct DriftReport {
  ReferenceSource reference_source = ReferenceSource::kRunning;
  int64_t reference_set_unix_nanos = 0;
  int64_t window_samples = 0;  // Values per channel in the window.
  int64_t window_seconds = 0;  // buckets x bucket_seconds.
  std::optional<DriftMeasures> measures;
};

// Per channel c, window (mw, vw = M2 / count, the biased variance) against
// the reference (mr, vr), a = vw + eps, b = vr + eps:
//   shift = |mw - mr| / sqrt(b);
//   kl = 0.5 (a/b + b/a - 2) + 0.5 (mw - mr)^2 (1/a + 1/b), the symmetric
//        Kullback-Leibler divergence of N(mw, a) and N(mr, b);
// kl_max, kl_mean (over channels), shift_max, and channels_drifted, the
// channels with kl > options.threshold. `window` has one entry per
// reference channel; its smallest count is the window_samples.
DriftReport MeasureDrift(const DriftReference& reference,
                         absl::Span<const Moments> window, double eps,
                         const DriftOptions& options);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_DRIFT_MEASURES_H_

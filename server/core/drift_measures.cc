#include "server/core/drift_measures.h"

#include <algorithm>
#include <cmath>

namespace normd {

DriftReport MeasureDrift(const DriftReference& reference,
                         absl::Span<const Moments> window, double eps,
                         const DriftOptions& options) {
  DriftReport report;
  report.reference_source = reference.source;
  report.reference_set_unix_nanos = reference.set_unix_nanos;
  report.window_seconds = options.buckets * options.bucket_seconds;
  const size_t channels = std::min(window.size(), reference.mean.size());
  if (channels == 0) return report;
  int64_t samples = window[0].count;
  for (size_t c = 0; c < channels; ++c) {
    samples = std::min(samples, window[c].count);
  }
  report.window_samples = samples;
  if (samples < std::max<int64_t>(options.min_samples, 1)) return report;

  DriftMeasures& m = report.measures.emplace();
  m.kl.resize(channels);
  m.shift.resize(channels);
  double kl_sum = 0;
  for (size_t c = 0; c < channels; ++c) {
    const double a = window[c].BiasedVariance() + eps;
    const double b = reference.var[c] + eps;
    const double d = window[c].mean - reference.mean[c];
    m.shift[c] = std::abs(d) / std::sqrt(b);
    m.kl[c] = 0.5 * (a / b + b / a - 2) + 0.5 * d * d * (1 / a + 1 / b);
    kl_sum += m.kl[c];
    m.kl_max = std::max(m.kl_max, m.kl[c]);
    m.shift_max = std::max(m.shift_max, m.shift[c]);
    if (m.kl[c] > options.threshold) ++m.channels_drifted;
  }
  m.kl_mean = kl_sum / static_cast<double>(channels);
  return report;
}

}  // namespace normd

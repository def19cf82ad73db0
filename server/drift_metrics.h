// The drift gauges, computed when Prometheus scrapes: for every model with
// a drift reference (at most --max_drift_models of them, those with the
// largest kl_max first), normd_model_drift_{kl_max, kl_mean, shift_max,
// channels_drifted, window_samples}{model="..."}; a model whose window is
// below --drift_min_samples exports only its window_samples. The models left
// out are counted in normd_drift_models_unexported, and
// normd_drift_threshold is --drift_threshold (what the NormdModelInputDrift
// alert compares kl_max with).
//
// Thread-safe: Collect reads the service, which is.
#ifndef NORMD_SERVER_DRIFT_METRICS_H_
#define NORMD_SERVER_DRIFT_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <cstdint>
#include <vector>

#include "server/service/service.h"

namespace normd {

class DriftMetrics final : public prometheus::Collectable {
 public:
  // `service` must outlive the metrics' registration.
  DriftMetrics(const Service& service, int64_t max_models, double threshold);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const Service& service_;
  const int64_t max_models_;
  const double threshold_;
};

}  // namespace normd

#endif  // NORMD_SERVER_DRIFT_METRICS_H_

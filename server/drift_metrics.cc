#include "server/drift_metrics.h"

#include <algorithm>
#include <string>
#include <utility>

namespace normd {
namespace {

prometheus::MetricFamily Gauges(const char* name, const char* help) {
  return {.name = name,
          .help = help,
          .type = prometheus::MetricType::Gauge,
          .metric = {}};
}

void AddGauge(prometheus::MetricFamily& family, const std::string& model,
              double value) {
  prometheus::ClientMetric metric;
  metric.label = {{"model", model}};
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

DriftMetrics::DriftMetrics(const Service& service, int64_t max_models,
                           double threshold)
    : service_(service), max_models_(max_models), threshold_(threshold) {}

std::vector<prometheus::MetricFamily> DriftMetrics::Collect() const {
  std::vector<std::pair<std::string, DriftReport>> reports;
  for (const BatchNormModel& model : service_.ListModels()) {
    if (std::optional<DriftReport> report = service_.Drift(model)) {
      reports.emplace_back(model.name, *std::move(report));
    }
  }
  // The largest kl_max first, models without measures after, by name.
  std::sort(reports.begin(), reports.end(), [](const auto& a, const auto& b) {
    const auto& x = a.second.measures;
    const auto& y = b.second.measures;
    if (x.has_value() != y.has_value()) return x.has_value();
    if (x.has_value() && x->kl_max != y->kl_max) return x->kl_max > y->kl_max;
    return a.first < b.first;
  });
  const auto exported =
      std::min<int64_t>(static_cast<int64_t>(reports.size()), max_models_);

  std::vector<prometheus::MetricFamily> families = {
      Gauges("normd_model_drift_kl_max",
             "Largest per-channel symmetric KL divergence of the model's "
             "observed inputs from its reference (absent below "
             "--drift_min_samples)."),
      Gauges("normd_model_drift_kl_mean",
             "Mean over channels of the symmetric KL divergence from the "
             "reference."),
      Gauges("normd_model_drift_shift_max",
             "Largest per-channel |window mean - reference mean| / "
             "sqrt(reference var + eps)."),
      Gauges("normd_model_drift_channels_drifted",
             "Channels whose KL divergence is above --drift_threshold."),
      Gauges("normd_model_drift_window_samples",
             "Values per channel in the model's observation window."),
      Gauges("normd_drift_models_unexported",
             "Models with a drift reference left out of the per-model drift "
             "gauges by --max_drift_models (those with the smallest "
             "kl_max)."),
      Gauges("normd_drift_threshold",
             "--drift_threshold: a channel whose KL divergence is above it "
             "has drifted.")};
  for (int64_t i = 0; i < exported; ++i) {
    const auto& [name, report] = reports[i];
    if (report.measures.has_value()) {
      AddGauge(families[0], name, report.measures->kl_max);
      AddGauge(families[1], name, report.measures->kl_mean);
      AddGauge(families[2], name, report.measures->shift_max);
      AddGauge(families[3], name,
               static_cast<double>(report.measures->channels_drifted));
    }
    AddGauge(families[4], name, static_cast<double>(report.window_samples));
  }
  prometheus::ClientMetric unexported;
  unexported.gauge.value =
      static_cast<double>(static_cast<int64_t>(reports.size()) - exported);
  families[5].metric.push_back(std::move(unexported));
  prometheus::ClientMetric threshold;
  threshold.gauge.value = threshold_;
  families[6].metric.push_back(std::move(threshold));
  return families;
}

}  // namespace normd

#include "server/service/service_metrics.h"

#include "server/service/status_mapping.h"

namespace normd {
namespace {

constexpr const char* kElementModes[kNumElementsModes] = {
    "layer_norm", "batch_norm_train", "batch_norm_eval",
    "fit",        "group_norm",       "instance_norm",
    "rms_norm",   "l2_norm",          "weight_norm"};

}  // namespace

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *buckets;
}

prometheus::Gauge& AddGauge(prometheus::Registry& registry, const char* name,
                            const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(
      {});
}

prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const char* name, const char* help) {
  return prometheus::BuildCounter()
      .Name(name)
      .Help(help)
      .Register(registry)
      .Add({});
}

ServiceMetrics::ServiceMetrics(prometheus::Registry& registry) {
  auto& requests = prometheus::BuildCounter()
                       .Name("normd_requests_total")
                       .Help(
                           "Calls answered, by front end (protocol: grpc, "
                           "oip_grpc, rest), method and status code (the "
                           "gRPC code's name, whatever the protocol).")
                       .Register(registry);
  auto& seconds = prometheus::BuildHistogram()
                      .Name("normd_request_duration_seconds")
                      .Help(
                          "Time from a call's arrival (a REST request's "
                          "headers) to its answer, in seconds, by front end "
                          "and method.")
                      .Register(registry);
  for (int p = 0; p < kNumProtocols; ++p) {
    const auto protocol = static_cast<Protocol>(p);
    for (int m = 0; m < kNumMethods; ++m) {
      const auto method = static_cast<Method>(m);
      if (!Serves(protocol, method)) continue;
      const prometheus::Labels labels = {{"protocol", ProtocolName(protocol)},
                                         {"method", MethodName(method)}};
      seconds_[p][m] = &seconds.Add(labels, LatencyBuckets());
      for (int c = 0; c < kNumCodes; ++c) {
        prometheus::Labels with_code = labels;
        with_code["code"] = GrpcCodeName(static_cast<absl::StatusCode>(c));
        requests_[p][m][c] = &requests.Add(with_code);
      }
    }
  }
  auto& elements = prometheus::BuildCounter()
                       .Name("normd_elements_total")
                       .Help("Tensor elements processed, by mode.")
                       .Register(registry);
  for (int e = 0; e < kNumElementsModes; ++e) {
    elements_[e] = &elements.Add({{"mode", kElementModes[e]}});
  }
  const auto gauge = [&](const char* name, const char* help) {
    return &AddGauge(registry, name, help);
  };
  const auto counter = [&](const char* name, const char* help) {
    return &AddCounter(registry, name, help);
  };
  models_ = gauge("normd_models", "BatchNorm models held in memory.");
  model_bytes_ = gauge("normd_model_bytes",
                       "Bytes the BatchNorm models are charged against "
                       "--max_model_bytes (each its full size, pooled "
                       "statistics included, from its creation).");
  model_bytes_limit_ =
      gauge("normd_max_model_bytes", "The --max_model_bytes limit.");
  open_streams_ = gauge("normd_open_streams",
                        "NormalizeStream and FitStream calls open (idle "
                        "ones hold no --max_inflight_requests slot).");
  idle_streams_ended_ = counter("normd_idle_streams_ended_total",
                                "Streams the server ended because their "
                                "client sent or took nothing for "
                                "--stream_idle_timeout.");
  inflight_ = gauge("normd_inflight_requests",
                    "Calls in progress, from every front end (native gRPC, "
                    "the Open Inference Protocol over gRPC and REST).");
  inflight_limit_ = gauge("normd_max_inflight_requests",
                          "The --max_inflight_requests limit (0: none); "
                          "saturation is normd_inflight_requests over it.");
  rejected_ = counter("normd_rejected_total",
                      "Calls and stream messages refused with "
                      "RESOURCE_EXHAUSTED by --max_inflight_requests or "
                      "--max_inflight_bytes.");
}

void ServiceMetrics::Handled(Protocol protocol, Method method,
                             absl::StatusCode code, double seconds) {
  const int p = static_cast<int>(protocol);
  const int m = static_cast<int>(method);
  if (seconds_[p][m] == nullptr) return;  // Not a call this protocol serves.
  requests_[p][m][GrpcCodeOf(code)]->Increment();
  seconds_[p][m]->Observe(seconds);
}

void ServiceMetrics::AddElements(ElementsMode mode, int64_t count) {
  elements_[static_cast<int>(mode)]->Increment(static_cast<double>(count));
}

void ServiceMetrics::SetModels(int64_t count, int64_t bytes) {
  models_->Set(static_cast<double>(count));
  model_bytes_->Set(static_cast<double>(bytes));
}

void ServiceMetrics::SetModelBytesLimit(int64_t limit) {
  model_bytes_limit_->Set(static_cast<double>(limit));
}

void ServiceMetrics::AddOpenStreams(double delta) {
  open_streams_->Increment(delta);
}

void ServiceMetrics::IdleStreamEnded() { idle_streams_ended_->Increment(); }

void ServiceMetrics::AddInflight(double delta) { inflight_->Increment(delta); }

void ServiceMetrics::SetInflightLimit(int64_t limit) {
  inflight_limit_->Set(static_cast<double>(limit));
}

}  // namespace normd

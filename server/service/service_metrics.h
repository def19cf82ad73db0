// Prometheus metrics of the service, whichever front end a call came
// through: calls by protocol, method and code and their latency, calls in
// flight and refused, elements processed, the models held, open streams.
// Every family and labelled handle is created once, in the constructor; the
// hot path only indexes cached pointers. No label carries a model name or
// any other unbounded value. Thread-safe (prometheus-cpp metrics are
// atomic).
#ifndef NORMD_SERVER_SERVICE_SERVICE_METRICS_H_
#define NORMD_SERVER_SERVICE_SERVICE_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstdint>

#include "absl/status/status.h"
#include "server/service/methods.h"

namespace normd {

// What normd_elements_total counts, as its `mode` label.
enum class ElementsMode {
  kLayerNorm,
  kBatchNormTrain,
  kBatchNormEval,
  kFit,
  kGroupNorm,
  kInstanceNorm,  // Stateless or with a model, training or eval.
  kRmsNorm,
  kL2Norm,
  kWeightNorm,
};
inline constexpr int kNumElementsModes = 9;

// The latency buckets of every request histogram, in seconds.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets();

// A gauge or counter without labels, its family registered in `registry`.
prometheus::Gauge& AddGauge(prometheus::Registry& registry, const char* name,
                            const char* help);
prometheus::Counter& AddCounter(prometheus::Registry& registry,
                                const char* name, const char* help);

class ServiceMetrics {
 public:
  explicit ServiceMetrics(prometheus::Registry& registry);

  // normd_requests_total{protocol,method,code} and
  // normd_request_duration_seconds{protocol,method}.
  void Handled(Protocol protocol, Method method, absl::StatusCode code,
               double seconds);
  void AddElements(ElementsMode mode, int64_t count);
  // The models held and the bytes they are charged (normd_model_bytes).
  void SetModels(int64_t count, int64_t bytes);
  void SetModelBytesLimit(int64_t limit);
  void AddOpenStreams(double delta);
  void IdleStreamEnded();
  void AddInflight(double delta);
  // The configured --max_inflight_requests (0: no limit), for saturation.
  void SetInflightLimit(int64_t limit);
  // A call or stream message refused by admission control.
  void Rejected() { rejected_->Increment(); }

 private:
  static constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED.
  // Null where the protocol does not serve the method.
  std::array<
      std::array<std::array<prometheus::Counter*, kNumCodes>, kNumMethods>,
      kNumProtocols>
      requests_{};
  std::array<std::array<prometheus::Histogram*, kNumMethods>, kNumProtocols>
      seconds_{};
  std::array<prometheus::Counter*, kNumElementsModes> elements_{};
  prometheus::Gauge* models_ = nullptr;
  prometheus::Gauge* model_bytes_ = nullptr;
  prometheus::Gauge* model_bytes_limit_ = nullptr;
  prometheus::Gauge* open_streams_ = nullptr;
  prometheus::Counter* idle_streams_ended_ = nullptr;
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Gauge* inflight_limit_ = nullptr;
  prometheus::Counter* rejected_ = nullptr;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_SERVICE_METRICS_H_

// Prometheus metrics of the REST front end's HTTP exchanges:
// normd_http_requests_total{endpoint,code} (the code label takes the
// statuses normd answers with, and "other" for any other) and
// normd_http_request_duration_seconds{endpoint}, from a request's first byte
// to its answer; and the connections open and refused. Requests refused
// before routing (framing, timeouts, header size) count under endpoint
// "unknown". Handles are created once; thread-safe (prometheus-cpp metrics
// are atomic).
#ifndef NORMD_SERVER_HTTP_HTTP_METRICS_H_
#define NORMD_SERVER_HTTP_HTTP_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>

#include "server/http/rest_router.h"

namespace normd {

class HttpMetrics {
 public:
  explicit HttpMetrics(prometheus::Registry& registry);
  void Handled(RestEndpoint endpoint, int http_status, double seconds);
  void AddConnections(double delta) { connections_->Increment(delta); }
  // A connection refused past --http_max_connections.
  void ConnectionRefused() { connections_refused_->Increment(); }

 private:
  static constexpr int kCodes[] = {200, 400, 401, 404, 405, 408, 413,
                                   414, 415, 429, 431, 500, 503, 505};
  static constexpr int kNumCodes = sizeof(kCodes) / sizeof(kCodes[0]) + 1;
  std::array<std::array<prometheus::Counter*, kNumCodes>, kNumRestEndpoints>
      requests_{};
  std::array<prometheus::Histogram*, kNumRestEndpoints> seconds_{};
  prometheus::Gauge* connections_ = nullptr;
  prometheus::Counter* connections_refused_ = nullptr;
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_HTTP_METRICS_H_

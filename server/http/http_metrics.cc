#include "server/http/http_metrics.h"

#include <string>

#include "server/service/service_metrics.h"

namespace normd {

HttpMetrics::HttpMetrics(prometheus::Registry& registry) {
  auto& requests = prometheus::BuildCounter()
                       .Name("normd_http_requests_total")
                       .Help(
                           "REST requests answered, by endpoint and HTTP "
                           "status code.")
                       .Register(registry);
  auto& seconds =
      prometheus::BuildHistogram()
          .Name("normd_http_request_duration_seconds")
          .Help(
              "Time from a REST request's first byte to its answer, in "
              "seconds.")
          .Register(registry);
  for (int e = 0; e < kNumRestEndpoints; ++e) {
    const char* endpoint = RestEndpointName(static_cast<RestEndpoint>(e));
    seconds_[e] = &seconds.Add({{"endpoint", endpoint}}, LatencyBuckets());
    for (int c = 0; c < kNumCodes; ++c) {
      requests_[e][c] = &requests.Add(
          {{"endpoint", endpoint},
           {"code", c + 1 < kNumCodes ? std::to_string(kCodes[c]) : "other"}});
    }
  }
  connections_ =
      &AddGauge(registry, "normd_http_connections", "REST connections open.");
  connections_refused_ =
      &AddCounter(registry, "normd_http_connections_refused_total",
                  "REST connections answered 503 and closed at once because "
                  "--http_max_connections were open.");
}

void HttpMetrics::Handled(RestEndpoint endpoint, int http_status,
                          double seconds) {
  const int e = static_cast<int>(endpoint);
  int c = 0;
  while (c + 1 < kNumCodes && kCodes[c] != http_status) ++c;
  requests_[e][c]->Increment();
  seconds_[e]->Observe(seconds);
}

}  // namespace normd

// Where a REST request's method and target lead: the Open Inference
// Protocol's endpoints (KServe v2) and Triton's repository, configuration
// and statistics extensions, with the model's name and version taken from
// the path (percent-decoded, so that a name with "/" travels as "%2F").
// Stateless; thread-safe.
#ifndef NORMD_SERVER_HTTP_REST_ROUTER_H_
#define NORMD_SERVER_HTTP_REST_ROUTER_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/service/methods.h"

namespace normd {

// The REST endpoints, as the `endpoint` label of the HTTP metrics.
enum class RestEndpoint {
  kServerMetadata,   // GET /v2
  kHealthLive,       // GET /v2/health/live
  kHealthReady,      // GET /v2/health/ready
  kModelMetadata,    // GET /v2/models/{name}[/versions/{version}]
  kModelReady,       // GET .../ready
  kModelInfer,       // POST .../infer
  kModelConfig,      // GET .../config
  kModelStatistics,  // GET /v2/models/stats, GET .../stats
  kRepositoryIndex,  // POST /v2/repository/index
  kUnknown,          // No endpoint, or a request refused before routing.
};
inline constexpr int kNumRestEndpoints = 10;

// "server_metadata", "health_live", ..., "unknown".
const char* RestEndpointName(RestEndpoint endpoint);

// The health probes (live, ready): they need no token and are never
// refused for load.
constexpr bool IsHealthProbe(RestEndpoint endpoint) {
  return endpoint == RestEndpoint::kHealthLive ||
         endpoint == RestEndpoint::kHealthReady;
}

// The service method an endpoint calls.
Method MethodOf(RestEndpoint endpoint);

struct RestRoute {
  RestEndpoint endpoint = RestEndpoint::kUnknown;
  // Percent-decoded; for the model endpoints (empty for GET
  // /v2/models/stats, which is every model's).
  std::string model;
  std::string version;  // From /versions/{version}; "" when absent.
  bool method_allowed = false;
  const char* allowed = "";  // The endpoint's methods, for 405's Allow.
};

// The route of `method` on `target` (its path, up to any "?"); kUnknown for
// a path that is none of the endpoints. INVALID_ARGUMENT naming the path for
// a malformed percent-encoding (a "%" not followed by two hex digits).
absl::StatusOr<RestRoute> RouteRestRequest(absl::string_view method,
                                           absl::string_view target);

// `segment` with every %XX replaced by its byte; nullopt when a "%" is not
// followed by two hex digits.
std::optional<std::string> PercentDecoded(absl::string_view segment);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_ROUTER_H_

// The gRPC ecosystem's metrics of normd's gRPC services, as
// go-grpc-prometheus names them (grpc_server_started_total,
// grpc_server_handled_total, grpc_server_handling_seconds with
// grpc_service, grpc_method, grpc_type and grpc_code), beside the service's
// own normd_requests_* of every front end. Handles are created once;
// thread-safe (prometheus-cpp metrics are atomic).
#ifndef NORMD_SERVER_RPC_GRPC_METRICS_H_
#define NORMD_SERVER_RPC_GRPC_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>

#include "absl/status/status.h"
#include "server/service/methods.h"

namespace normd {

class GrpcMetrics {
 public:
  explicit GrpcMetrics(prometheus::Registry& registry);

  // For the methods of normd.v1.Normalizer and
  // inference.GRPCInferenceService; others are ignored.
  void Started(Method method);
  void Handled(Method method, absl::StatusCode code, double seconds);

 private:
  static constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED.
  std::array<prometheus::Counter*, kNumMethods> started_{};
  std::array<std::array<prometheus::Counter*, kNumCodes>, kNumMethods>
      handled_{};
  std::array<prometheus::Histogram*, kNumMethods> handling_seconds_{};
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_GRPC_METRICS_H_

#include "server/rpc/grpc_metrics.h"

#include "server/service/service_metrics.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

// The grpc_type label, as in go-grpc-prometheus.
const char* GrpcType(Method method) {
  switch (method) {
    case Method::kNormalizeStream:
      return "bidi_stream";
    case Method::kFitStream:
      return "client_stream";
    default:
      return "unary";
  }
}

}  // namespace

GrpcMetrics::GrpcMetrics(prometheus::Registry& registry) {
  auto& started = prometheus::BuildCounter()
                      .Name("grpc_server_started_total")
                      .Help("RPCs started on the server.")
                      .Register(registry);
  auto& handled = prometheus::BuildCounter()
                      .Name("grpc_server_handled_total")
                      .Help("RPCs completed on the server, by status code.")
                      .Register(registry);
  auto& seconds = prometheus::BuildHistogram()
                      .Name("grpc_server_handling_seconds")
                      .Help(
                          "Time from receiving an RPC to its completion, in "
                          "seconds.")
                      .Register(registry);
  for (int m = 0; m < kNumMethods; ++m) {
    const auto method = static_cast<Method>(m);
    const char* service =
        Serves(Protocol::kGrpc, method)      ? "normd.v1.Normalizer"
        : Serves(Protocol::kOipGrpc, method) ? "inference.GRPCInferenceService"
                                             : nullptr;
    if (service == nullptr) continue;
    const prometheus::Labels labels = {{"grpc_service", service},
                                       {"grpc_method", MethodName(method)},
                                       {"grpc_type", GrpcType(method)}};
    started_[m] = &started.Add(labels);
    handling_seconds_[m] = &seconds.Add(labels, LatencyBuckets());
    for (int c = 0; c < kNumCodes; ++c) {
      prometheus::Labels with_code = labels;
      with_code["grpc_code"] = GrpcCodeName(static_cast<absl::StatusCode>(c));
      handled_[m][c] = &handled.Add(with_code);
    }
  }
}

void GrpcMetrics::Started(Method method) {
  if (prometheus::Counter* c = started_[static_cast<int>(method)]) {
    c->Increment();
  }
}

void GrpcMetrics::Handled(Method method, absl::StatusCode code,
                          double seconds) {
  const int m = static_cast<int>(method);
  if (handling_seconds_[m] == nullptr) return;
  handled_[m][GrpcCodeOf(code)]->Increment();
  handling_seconds_[m]->Observe(seconds);
}

}  // namespace normd

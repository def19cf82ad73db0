// A running normd: the composition root. It builds the engine and its
// durable state, the protocol-free service (server/service) with its
// admission and metrics, and the front ends that translate into it: the
// gRPC server (normd.v1.Normalizer, the Open Inference Protocol, health,
// reflection; server/rpc) and the REST listener (server/http), plus the
// Prometheus exposer. Start() recovers the state and brings everything up;
// Shutdown() marks the server not ready, stops accepting, lets calls in
// flight finish within the grace, writes a final snapshot and stops.
// Shutdown may be called from any thread, once.
#ifndef NORMD_SERVER_SERVER_H_
#define NORMD_SERVER_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/core/engine.h"
#include "server/core/parallel.h"
#include "server/drift_metrics.h"
#include "server/http/http_metrics.h"
#include "server/http/http_server.h"
#include "server/http/rest_api.h"
#include "server/rpc/grpc_metrics.h"
#include "server/rpc/health_service.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"
#include "server/rpc/reflection_service.h"
#include "server/service/admission.h"
#include "server/service/inference.h"
#include "server/service/readiness.h"
#include "server/service/service.h"
#include "server/service/service_metrics.h"
#include "server/state/durable_state.h"
#include "server/state_metrics.h"

namespace normd {

// Everything the command-line flags configure (see main.cc's --help).
struct ServerOptions {
  std::string bind_address = "0.0.0.0";
  int port = 50051;         // 0: pick a free port.
  int metrics_port = 9464;  // 0: pick a free port; -1: no metrics endpoint.
  int http_port = 8000;     // OIP REST; 0: pick a free port; -1: off.
  int http_threads = 1;     // REST I/O threads.
  int64_t http_max_connections = 1000;
  absl::Duration http_header_timeout = absl::Seconds(5);
  absl::Duration http_idle_timeout = absl::Seconds(5);
  absl::Duration http_body_timeout = absl::Seconds(30);
  int64_t http_min_body_rate = 64 << 10;
  absl::Duration http_linger_timeout = absl::Seconds(30);
  int64_t http_max_header_bytes = 64 << 10;
  int64_t max_message_bytes = 64 << 20;
  int64_t max_models = 10000;
  int64_t max_num_features = 65536;
  int64_t max_model_bytes = int64_t{1} << 30;
  int max_rank = kDefaultMaxRank;
  // How inputs of models with a drift reference are observed and judged.
  DriftOptions drift;
  // Most models with their own drift series (--max_drift_models).
  int64_t max_drift_models = 1000;
  // Streams that wait on their client this long are ended; zero: never.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  int tbb_threads = 0;  // 0: one per core.
  absl::Duration shutdown_grace = absl::Seconds(10);
  int64_t buffer_pool_bytes = 64 << 20;           // See BufferPool.
  int64_t max_inflight_requests = 256;            // 0: no limit.
  int64_t max_inflight_bytes = int64_t{1} << 30;  // 0: no limit.
  std::string state_dir;  // Empty: in-memory state only.
  // TLS: PEM files. Cert and key enable TLS; a client CA also requires and
  // verifies client certificates (mTLS).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  // A file holding the bearer token every call but health must carry
  // ("authorization: Bearer <token>"); empty: no token.
  std::string auth_token_file;
  std::string metrics_bind_address;  // Empty: bind_address.
  int64_t snapshot_log_bytes = 64 << 20;
};

class NormdServer {
 public:
  // UNAVAILABLE if a port cannot be bound; INVALID_ARGUMENT for bad options.
  static absl::StatusOr<std::unique_ptr<NormdServer>> Start(
      const ServerOptions& options);
  ~NormdServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // -1: no REST listener.

  void Shutdown();

 private:
  explicit NormdServer(const ServerOptions& options);
  // Not ready (every front end's readiness), e.g. at shutdown or when the
  // state can no longer be written.
  void SetReady(bool ready);

  class StateObserver;

  const ServerOptions options_;
  // The compute arena (--tbb_threads), for the process's lifetime.
  std::unique_ptr<ScopedComputeThreads> compute_threads_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  // Registered with exposer_ (which holds it weakly) once the service is.
  std::shared_ptr<DriftMetrics> drift_metrics_;
  std::unique_ptr<ServiceMetrics> metrics_;
  std::unique_ptr<GrpcMetrics> grpc_metrics_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<StateMetrics> state_metrics_;
  std::unique_ptr<state::DurabilityObserver> state_observer_;
  std::unique_ptr<state::DurableState> durable_;
  Readiness readiness_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<Inference> inference_;
  std::unique_ptr<NormalizerService> normalizer_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<OipService> oip_;
  std::unique_ptr<ReflectionService> reflection_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpMetrics> http_metrics_;
  std::unique_ptr<RestApi> rest_api_;
  std::unique_ptr<HttpServer> rest_;
  int port_ = 0;
  int http_port_ = -1;
  int metrics_port_ = -1;
  bool shut_down_ = false;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVER_H_

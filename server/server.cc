#include "server/server.h"

#include <tbb/info.h>

#include <exception>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/rpc/grpc_transport.h"
#include "server/service/buffer_pool.h"
#include "server/service/flag_file.h"
#include "server/service/logging.h"

namespace normd {
namespace {

constexpr const char* kServiceName = "normd.v1.Normalizer";
constexpr const char* kOipServiceName = "inference.GRPCInferenceService";

absl::Status PositiveDuration(absl::Duration d, absl::string_view flag) {
  if (d > absl::ZeroDuration()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": must be > 0, got ", absl::FormatDuration(d)));
}

// Every option checked before anything starts; INVALID_ARGUMENT naming the
// flag.
absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.max_message_bytes < 1 ||
      options.max_message_bytes > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes: must be in 1..", std::numeric_limits<int>::max(),
        ", got ", options.max_message_bytes));
  }
  if (options.port < 0 || options.port > 65535 || options.metrics_port < -1 ||
      options.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--port must be in 0..65535 and --metrics_port in -1..65535, got ",
        options.port, " and ", options.metrics_port));
  }
  if (options.http_port < -1 || options.http_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_port: must be in -1..65535 (-1: no REST), got ",
                     options.http_port));
  }
  if (options.http_threads < 1 || options.http_threads > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_threads: must be in 1..64, got ", options.http_threads));
  }
  if (options.http_max_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_max_connections: must be >= 1, got ",
                     options.http_max_connections));
  }
  if (options.http_max_header_bytes < 1024 ||
      options.http_max_header_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_max_header_bytes: must be in 1024..2^30, got ",
                     options.http_max_header_bytes));
  }
  for (const auto& [duration, flag] :
       {std::pair{options.http_header_timeout, "--http_header_timeout"},
        std::pair{options.http_idle_timeout, "--http_idle_timeout"},
        std::pair{options.http_body_timeout, "--http_body_timeout"}}) {
    if (absl::Status s = PositiveDuration(duration, flag); !s.ok()) return s;
  }
  if (options.http_min_body_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_min_body_rate: must be >= 0 (0: no minimum), "
                     "got ",
                     options.http_min_body_rate));
  }
  if (options.http_linger_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_linger_timeout: must be >= 0s, got ",
                     absl::FormatDuration(options.http_linger_timeout)));
  }
  if (options.max_inflight_requests < 0 || options.max_inflight_bytes < 0) {
    return absl::InvalidArgumentError(
        "--max_inflight_requests and --max_inflight_bytes must be >= 0 (0: "
        "no limit)");
  }
  if (options.max_models < 0 || options.max_num_features < 1 ||
      options.max_num_features > (int64_t{1} << 32) ||
      options.max_model_bytes < 0 || options.tbb_threads < 0 ||
      options.buffer_pool_bytes < 0) {
    return absl::InvalidArgumentError(
        "--max_models must be >= 0, --max_num_features in 1..2^32, "
        "--max_model_bytes >= 0, --tbb_threads >= 0 and --buffer_pool_bytes "
        ">= 0");
  }
  if (options.drift.buckets < 1 || options.drift.buckets > 1000 ||
      options.drift.bucket_seconds < 1 || options.drift.sample_every < 1 ||
      options.drift.min_samples < 1 ||
      !(options.drift.threshold >= 0 &&
        options.drift.threshold < std::numeric_limits<double>::infinity())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--drift_buckets must be in 1..1000 (got ", options.drift.buckets,
        "), --drift_bucket_seconds, --drift_sample_every and "
        "--drift_min_samples >= 1 (got ",
        options.drift.bucket_seconds, ", ", options.drift.sample_every, ", ",
        options.drift.min_samples,
        ") and --drift_threshold finite and >= 0 "
        "(got ",
        options.drift.threshold, ")"));
  }
  if (options.max_drift_models < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_drift_models: must be >= 0, got ", options.max_drift_models));
  }
  if (options.max_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_rank: must be >= 1, got ", options.max_rank));
  }
  if (options.stream_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream_idle_timeout: must be >= 0 (0: never), got ",
                     absl::FormatDuration(options.stream_idle_timeout)));
  }
  if (!options.state_dir.empty() && options.snapshot_log_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--snapshot_log_bytes: must be >= 1, got ",
                     options.snapshot_log_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

// Forwards the durable state's events to its metrics and, when the state can
// no longer be written, logs it and takes the server out of service (not
// ready), since every change would be refused. Thread-safe.
class NormdServer::StateObserver final : public state::DurabilityObserver {
 public:
  StateObserver(StateMetrics& metrics, NormdServer& server)
      : metrics_(metrics), server_(server) {}
  void OnSync(int64_t records, int64_t bytes, double seconds) override {
    metrics_.OnSync(records, bytes, seconds);
  }
  void OnSnapshot(int64_t bytes, double seconds) override {
    metrics_.OnSnapshot(bytes, seconds);
  }
  void OnFailure(const absl::Status& error) override {
    metrics_.OnFailure(error);
    Log(LogSeverity::kError,
        absl::StrCat(error.message(), "; health is now NOT_SERVING"));
    server_.SetReady(false);
  }

 private:
  StateMetrics& metrics_;
  NormdServer& server_;
};

NormdServer::NormdServer(const ServerOptions& options) : options_(options) {}

NormdServer::~NormdServer() {
  Shutdown();
  // The drift gauges read the service, which goes before the exposer does.
  if (exposer_ != nullptr && drift_metrics_ != nullptr) {
    exposer_->RemoveCollectable(drift_metrics_);
  }
}

void NormdServer::SetReady(bool ready) {
  readiness_.Set(ready);
  if (health_ == nullptr) return;
  health_->SetServing("", ready);
  health_->SetServing(kServiceName, ready);
  health_->SetServing(kOipServiceName, ready);
}

absl::StatusOr<std::unique_ptr<NormdServer>> NormdServer::Start(
    const ServerOptions& options) {
  if (absl::Status s = ValidateOptions(options); !s.ok()) return s;
  std::string auth_token;
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token =
        ReadFlagFile(options.auth_token_file, "--auth_token_file");
    if (!token.ok()) return token.status();
    auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file: ", options.auth_token_file, " holds no token"));
    }
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(
          {options.tls_cert, options.tls_key, options.tls_client_ca});
  if (!credentials.ok()) return credentials.status();
  BufferPool::Global().SetMaxRetainedBytes(
      static_cast<size_t>(options.buffer_pool_bytes));
  std::unique_ptr<NormdServer> server(new NormdServer(options));
  server->compute_threads_ = std::make_unique<ScopedComputeThreads>(
      options.tbb_threads > 0 ? options.tbb_threads
                              : tbb::info::default_concurrency());
  server->registry_ = std::make_shared<prometheus::Registry>();
  server->metrics_ = std::make_unique<ServiceMetrics>(*server->registry_);
  server->grpc_metrics_ = std::make_unique<GrpcMetrics>(*server->registry_);
  if (options.metrics_port >= 0) {
    const std::string address = HostPort(options.metrics_bind_address.empty()
                                             ? options.bind_address
                                             : options.metrics_bind_address,
                                         options.metrics_port);
    try {
      server->exposer_ = std::make_unique<prometheus::Exposer>(address);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(
          "--metrics_port: cannot serve metrics on ", address, ": ", e.what()));
    }
    server->exposer_->RegisterCollectable(server->registry_);
    const auto ports = server->exposer_->GetListeningPorts();
    server->metrics_port_ = ports.empty() ? options.metrics_port : ports[0];
  }
  server->engine_ = std::make_unique<Engine>(
      ModelStoreOptions{.max_models = options.max_models,
                        .max_num_features = options.max_num_features,
                        .max_model_bytes = options.max_model_bytes},
      options.max_rank, options.drift);
  if (!options.state_dir.empty()) {
    state::RecoveryReport report;
    absl::StatusOr<std::unique_ptr<state::DurableState>> durable =
        state::DurableState::Open(
            {options.state_dir, options.snapshot_log_bytes},
            server->engine_->store(), &report);
    if (!durable.ok()) return durable.status();
    server->durable_ = std::move(*durable);
    for (const std::string& warning : report.warnings) {
      Log(LogSeverity::kWarning, warning);
    }
    Log(LogSeverity::kInfo,
        absl::StrCat("state_dir ", options.state_dir, ": ", report.models,
                     " models recovered from ",
                     report.snapshot_file.empty() ? "(no snapshot)"
                                                  : report.snapshot_file,
                     " + ", report.records_replayed, " log records"));
    server->state_metrics_ = std::make_unique<StateMetrics>(*server->registry_);
    const ModelStore& store = server->engine_->store();
    if (store.model_bytes() > options.max_model_bytes) {
      Log(LogSeverity::kWarning,
          absl::StrCat(
              "the recovered models take ", store.model_bytes(),
              " bytes, more than --max_model_bytes = ", options.max_model_bytes,
              "; they are all kept, and new models are refused "
              "until enough are deleted"));
    }
  }
  server->metrics_->SetModels(server->engine_->store().size(),
                              server->engine_->store().model_bytes());
  server->metrics_->SetModelBytesLimit(options.max_model_bytes);
  server->admission_ = std::make_unique<Admission>(
      options.max_inflight_requests, options.max_inflight_bytes);
  server->metrics_->SetInflightLimit(options.max_inflight_requests);
  const std::string auth_token_for_reflection = auth_token;
  server->service_ = std::make_unique<Service>(
      *server->engine_, *server->metrics_, *server->admission_,
      ServiceOptions{.auth_token = std::move(auth_token),
                     .max_message_bytes = options.max_message_bytes});
  if (server->exposer_ != nullptr) {
    server->drift_metrics_ = std::make_shared<DriftMetrics>(
        *server->service_, options.max_drift_models, options.drift.threshold);
    server->exposer_->RegisterCollectable(server->drift_metrics_);
  }
  server->inference_ = std::make_unique<Inference>(
      *server->service_, server->readiness_, NORMD_VERSION);
  const GrpcFrontEnd front{*server->service_, *server->grpc_metrics_};
  server->normalizer_ = std::make_unique<NormalizerService>(
      front, NormalizerServiceOptions{.stream_idle_timeout =
                                          options.stream_idle_timeout});

  // normd's own health service (see health_service.h), not gRPC's default.
  grpc::EnableDefaultHealthCheckService(false);
  server->health_ = std::make_unique<HealthService>();
  if (server->durable_ != nullptr) {
    server->state_observer_ =
        std::make_unique<StateObserver>(*server->state_metrics_, *server);
    server->durable_->SetObserver(server->state_observer_.get());
  }
  server->oip_ = std::make_unique<OipService>(front, *server->inference_);
  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{kServiceName, kOipServiceName,
                               "grpc.health.v1.Health",
                               "grpc.reflection.v1alpha.ServerReflection"},
      auth_token_for_reflection, server->normalizer_->watchdog());
  grpc::ServerBuilder builder;
  ConfigureServerBuilder(options.bind_address, options.port,
                         options.max_message_bytes, builder, &server->port_,
                         *credentials);
  builder.RegisterService(server->normalizer_.get());
  builder.RegisterService(server->oip_.get());
  builder.RegisterService(server->health_.get());
  builder.RegisterService(server->reflection_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--port: cannot listen for gRPC on ",
                     HostPort(options.bind_address, options.port)));
  }
  if (options.http_port >= 0) {
    server->http_metrics_ = std::make_unique<HttpMetrics>(*server->registry_);
    server->rest_api_ = std::make_unique<RestApi>(
        *server->service_, *server->inference_,
        RestLimits{.max_body_bytes = options.max_message_bytes});
    absl::StatusOr<std::unique_ptr<HttpServer>> rest = HttpServer::Start(
        HttpServerOptions{.bind_address = options.bind_address,
                          .port = options.http_port,
                          .tls_cert = options.tls_cert,
                          .tls_key = options.tls_key,
                          .tls_client_ca = options.tls_client_ca,
                          .io_threads = options.http_threads,
                          .max_connections = options.http_max_connections,
                          .max_header_bytes = options.http_max_header_bytes,
                          .header_timeout = options.http_header_timeout,
                          .idle_timeout = options.http_idle_timeout,
                          .body_timeout = options.http_body_timeout,
                          .min_body_rate = options.http_min_body_rate,
                          .linger_timeout = options.http_linger_timeout},
        *server->rest_api_, *server->http_metrics_);
    if (!rest.ok()) return rest.status();
    server->rest_ = std::move(*rest);
    server->http_port_ = server->rest_->port();
  }
  server->SetReady(true);
  return server;
}

void NormdServer::Shutdown() {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  const absl::Time deadline = absl::Now() + options_.shutdown_grace;
  // Not ready; every health watch told NOT_SERVING and ended.
  readiness_.Set(false);
  health_->Shutdown();
  // Both front ends stop accepting at once and finish what is in flight by
  // the same deadline.
  std::thread grpc_stop(
      [&] { server_->Shutdown(absl::ToChronoTime(deadline)); });
  if (rest_ != nullptr) rest_->Stop(deadline);
  grpc_stop.join();
  server_->Wait();
  if (durable_ != nullptr) {
    if (absl::Status s = durable_->Close(); !s.ok()) {
      Log(LogSeverity::kError,
          absl::StrCat("final snapshot failed (the log still holds every "
                       "change): ",
                       s.ToString()));
    }
  }
}

}  // namespace normd

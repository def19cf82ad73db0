#include "server/rpc/server.h"

#include <malloc.h>

#include <exception>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/rpc/buffer_pool.h"
#include "server/rpc/logging.h"
#include "server/rpc/reflection_service.h"

namespace normd {
namespace {

constexpr const char* kServiceName = "normd.v1.Normalizer";
constexpr const char* kOipServiceName = "inference.GRPCInferenceService";

// The contents of the file `path` given by `flag`; INVALID_ARGUMENT naming
// the flag if it cannot be read or is empty.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path,
                                         absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  if (!in || contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot read ", path, " (missing, unreadable or empty)"));
  }
  return contents.str();
}

// Forwards the durable state's events to its metrics and, when the state can
// no longer be written, logs it and takes the server out of service (health
// NOT_SERVING), since every change would be refused. Thread-safe.
class StateObserver final : public state::DurabilityObserver {
 public:
  StateObserver(StateMetrics& metrics, HealthService& health)
      : metrics_(metrics), health_(health) {}
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
    health_.SetServing(kServiceName, false);
    health_.SetServing(kOipServiceName, false);
    health_.SetServing("", false);
  }

 private:
  StateMetrics& metrics_;
  HealthService& health_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty() && options.tls_key.empty()) {
    if (!options.tls_client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca: needs --tls_cert and --tls_key (mTLS is TLS with "
          "client certificates)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (options.tls_cert.empty() || options.tls_key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both (PEM certificate chain and its "
        "private key) or neither");
  }
  absl::StatusOr<std::string> cert =
      ReadFlagFile(options.tls_cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFlagFile(options.tls_key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!options.tls_client_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFlagFile(options.tls_client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

absl::Status LimitMallocArenas(int arenas) {
  if (arenas < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--malloc_arenas must be >= 0, is ", arenas));
  }
#ifdef NORMD_SANITIZED_BUILD  // CMakeLists.txt, for GCC's and clang's.
  // The sanitizers bring their own allocator, without glibc's arenas.
  return absl::OkStatus();
#endif
  if (arenas > 0 && mallopt(M_ARENA_MAX, arenas) != 1) {
    return absl::UnimplementedError(
        "--malloc_arenas: this process's malloc ignores M_ARENA_MAX (a "
        "preloaded allocator?); left as it is");
  }
  return absl::OkStatus();
}

void ConfigureServerBuilder(
    const ServerOptions& options, grpc::ServerBuilder& builder, int* port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  builder.AddListeningPort(HostPort(options.bind_address, options.port),
                           std::move(credentials), port);
  // A second normd on a busy port must fail, not silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
}

NormdServer::NormdServer(const ServerOptions& options) : options_(options) {}

NormdServer::~NormdServer() { Shutdown(); }

absl::StatusOr<std::unique_ptr<NormdServer>> NormdServer::Start(
    const ServerOptions& options) {
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
  if (options.http_threads < 1 || options.http_threads > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http_threads: must be in 1..4096, got ", options.http_threads));
  }
  if (options.http_max_header_bytes < 1024 ||
      options.http_max_header_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_max_header_bytes: must be in 1024..2^30, got ",
                     options.http_max_header_bytes));
  }
  if (options.http_idle_timeout < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http_idle_timeout: must be >= 1s, got ",
                     absl::FormatDuration(options.http_idle_timeout)));
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
  if (options.max_rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_rank: must be >= 1, got ", options.max_rank));
  }
  if (options.stream_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stream_idle_timeout: must be >= 0 (0: never), got ",
                     absl::FormatDuration(options.stream_idle_timeout)));
  }
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
      MakeServerCredentials(options);
  if (!credentials.ok()) return credentials.status();
  BufferPool::Global().SetMaxRetainedBytes(
      static_cast<size_t>(options.buffer_pool_bytes));
  std::unique_ptr<NormdServer> server(new NormdServer(options));
  if (options.tbb_threads > 0) {
    server->tbb_threads_ = std::make_unique<tbb::global_control>(
        tbb::global_control::max_allowed_parallelism, options.tbb_threads);
  }
  server->registry_ = std::make_shared<prometheus::Registry>();
  server->metrics_ = std::make_unique<ServerMetrics>(*server->registry_);
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
      options.max_rank);
  if (!options.state_dir.empty()) {
    if (options.snapshot_log_bytes < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--snapshot_log_bytes: must be >= 1, got ",
                       options.snapshot_log_bytes));
    }
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
  const std::string auth_token_for_others = auth_token;
  server->service_ = std::make_unique<NormalizerService>(
      *server->engine_, *server->metrics_, *server->admission_,
      NormalizerServiceOptions{
          .auth_token = std::move(auth_token),
          .max_message_bytes = options.max_message_bytes,
          .stream_idle_timeout = options.stream_idle_timeout});

  // normd's own health service (see health_service.h), not gRPC's default.
  grpc::EnableDefaultHealthCheckService(false);
  server->health_ = std::make_unique<HealthService>();
  if (server->durable_ != nullptr) {
    server->state_observer_ = std::make_unique<StateObserver>(
        *server->state_metrics_, *server->health_);
    server->durable_->SetObserver(server->state_observer_.get());
  }
  server->oip_ =
      std::make_unique<OipService>(*server->service_, *server->health_);
  server->reflection_ = std::make_unique<ReflectionService>(
      std::vector<std::string>{kServiceName, kOipServiceName,
                               "grpc.health.v1.Health",
                               "grpc.reflection.v1alpha.ServerReflection"},
      auth_token_for_others, server->service_->watchdog());
  grpc::ServerBuilder builder;
  const std::string address = HostPort(options.bind_address, options.port);
  ConfigureServerBuilder(options, builder, &server->port_, *credentials);
  builder.RegisterService(server->service_.get());
  builder.RegisterService(server->oip_.get());
  builder.RegisterService(server->health_.get());
  builder.RegisterService(server->reflection_.get());
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--port: cannot listen for gRPC on ", address));
  }
  if (options.http_port >= 0) {
    server->http_metrics_ = std::make_unique<HttpMetrics>(*server->registry_);
    server->rest_handler_ = std::make_unique<RestHandler>(
        *server->oip_, *server->service_, *server->http_metrics_,
        auth_token_for_others);
    absl::StatusOr<std::unique_ptr<RestServer>> rest = RestServer::Start(
        RestServerOptions{.bind_address = options.bind_address,
                          .port = options.http_port,
                          .tls_cert = options.tls_cert,
                          .tls_key = options.tls_key,
                          .tls_client_ca = options.tls_client_ca,
                          .max_body_bytes = options.max_message_bytes,
                          .threads = options.http_threads,
                          .idle_timeout = options.http_idle_timeout,
                          .linger_timeout = options.http_linger_timeout,
                          .max_header_bytes = options.http_max_header_bytes},
        *server->rest_handler_);
    if (!rest.ok()) return rest.status();
    server->rest_ = std::move(*rest);
    server->http_port_ = server->rest_->port();
  }
  server->health_->SetServing("", true);
  server->health_->SetServing(kServiceName, true);
  server->health_->SetServing(kOipServiceName, true);
  return server;
}

void NormdServer::Shutdown() {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // NOT_SERVING for every service name, watches told and ended.
  health_->Shutdown();
  // REST stops accepting and finishes the requests it is answering.
  if (rest_ != nullptr) rest_->Stop();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + options_.shutdown_grace));
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

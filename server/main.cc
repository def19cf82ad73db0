// normd: the tensor normalization server. See README.md and --help.
#include <signal.h>

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "google/protobuf/stubs/logging.h"
#include "server/core/simd/target.h"
#include "server/malloc_config.h"
#include "server/server.h"
#include "server/service/logging.h"

ABSL_FLAG(std::string, bind_address, "0.0.0.0",
          "Address the gRPC, REST and metrics ports listen on (e.g. "
          "127.0.0.1, ::).");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free port (logged).");
ABSL_FLAG(int, metrics_port, 9464,
          "Prometheus metrics port (HTTP GET /metrics); 0 picks a free port, "
          "-1 disables the endpoint.");
ABSL_FLAG(int, http_port, 8000,
          "Open Inference Protocol (KServe v2) REST port (/v2/...); 0 picks a "
          "free port (logged), -1 disables REST. TLS and the bearer token as "
          "for gRPC.");
ABSL_FLAG(int, http_threads, 1,
          "REST I/O threads (1..64): they only move bytes; any number of "
          "connections share them, and parsing and computing run in the "
          "compute arena (--tbb_threads).");
ABSL_FLAG(int64_t, http_max_connections, 1000,
          "REST connections open at once; past it a new connection gets 503 "
          "and is closed (metric normd_http_connections_refused_total).");
ABSL_FLAG(absl::Duration, http_header_timeout, absl::Seconds(5),
          "A REST request's line and headers must arrive within this long "
          "of its first byte; else 408 and the connection is closed.");
ABSL_FLAG(absl::Duration, http_idle_timeout, absl::Seconds(5),
          "A REST keep-alive connection with no request for this long is "
          "closed.");
ABSL_FLAG(absl::Duration, http_body_timeout, absl::Seconds(30),
          "A REST request's body must arrive whole within this long of its "
          "headers (and an answer be taken by the client within it); else "
          "408 and the connection is closed.");
ABSL_FLAG(int64_t, http_min_body_rate, 64 << 10,
          "After its first second, a REST body must arrive at no less than "
          "this many bytes per second on average; else 408 and the "
          "connection is closed. 0: no minimum.");
ABSL_FLAG(absl::Duration, http_linger_timeout, absl::Seconds(30),
          "After answering a REST request before reading its body (401, 413, "
          "429), how long normd goes on discarding what the client still "
          "sends before it closes the connection, so that the client reads "
          "the answer rather than a reset (after the first "
          "--http_idle_timeout, at no less than --http_min_body_rate; "
          ">= 0s).");
ABSL_FLAG(int64_t, http_max_header_bytes, 64 << 10,
          "Largest REST request line and headers together; past it the "
          "client gets 431 and the connection is closed.");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20,
          "Largest request or response message in bytes; bigger requests get "
          "RESOURCE_EXHAUSTED (gRPC) or 413 (a REST body, refused before it "
          "is read).");
ABSL_FLAG(int64_t, max_models, 10000,
          "Most BatchNorm models held at once; creating more is "
          "RESOURCE_EXHAUSTED. 0: a replica for the stateless modes only "
          "(an autoscaled KServe InferenceService), where every model call "
          "that would create one is refused.");
ABSL_FLAG(int64_t, max_num_features, 65536,
          "Most channels (num_features) of one model; more is "
          "RESOURCE_EXHAUSTED naming this flag.");
ABSL_FLAG(int64_t, max_model_bytes, int64_t{1} << 30,
          "Most bytes all BatchNorm models together may hold. Each model is "
          "charged its full size from its creation (56 bytes per channel, "
          "pooled statistics included, plus its name and ~256 bytes), so a "
          "training step never fails for want of memory; a model with a "
          "drift reference is charged 16 + 24 x --drift_buckets bytes per "
          "channel more, for the reference and its observation window. "
          "Creating, growing or setting a reference past the budget is "
          "RESOURCE_EXHAUSTED naming this flag. Metric normd_model_bytes.");
ABSL_FLAG(int64_t, drift_buckets, 10,
          "Drift: the observation window of a model with a reference is this "
          "many buckets of --drift_bucket_seconds; the oldest expires as a "
          "new one starts (1..1000). Each costs 24 bytes per channel of "
          "every observed model.");
ABSL_FLAG(int64_t, drift_bucket_seconds, 60,
          "Drift: the length of one window bucket in seconds (>= 1).");
ABSL_FLAG(int64_t, drift_sample_every, 1,
          "Drift: observe every Nth request of each model with a reference "
          "(1: every request; >= 1).");
ABSL_FLAG(int64_t, drift_min_samples, 1000,
          "Drift: below this many values per channel in the window the "
          "measures (kl_max, ...) are absent rather than noise (>= 1).");
ABSL_FLAG(double, drift_threshold, 0.1,
          "Drift: a channel whose symmetric KL divergence from the reference "
          "is above this counts in channels_drifted (finite, >= 0).");
ABSL_FLAG(int64_t, max_drift_models, 1000,
          "Drift: the most models with a drift reference that get their own "
          "normd_model_drift_* series (the largest kl_max first); the rest "
          "are counted in normd_drift_models_unexported (>= 0).");
ABSL_FLAG(int, max_rank, 32,
          "Most dims of a request tensor (input, weight, bias); more is "
          "INVALID_ARGUMENT naming the field and this flag.");
ABSL_FLAG(absl::Duration, stream_idle_timeout, absl::Seconds(60),
          "A NormalizeStream or FitStream whose client sends no message (or "
          "takes no response) for this long is ended with CANCELLED (the "
          "steps it carried stay applied). Idle streams hold no "
          "--max_inflight_requests slot. 0: never.");
ABSL_FLAG(int, tbb_threads, 0,
          "Threads for the parallel reductions (oneTBB); 0 = one per core.");
ABSL_FLAG(int64_t, buffer_pool_bytes, 64 << 20,
          "Bytes of freed tensor buffers (>= 256 KiB each) kept for reuse, "
          "so that large requests do not page-fault fresh memory; 0 keeps "
          "none.");
ABSL_FLAG(int64_t, max_inflight_requests, 256,
          "Most calls (native gRPC, Open Inference Protocol over gRPC and "
          "REST) and stream messages being processed at once (a stream "
          "waiting on its client counts for nothing); more get "
          "RESOURCE_EXHAUSTED (REST: 429) at once instead of queuing. 0: no "
          "limit.");
ABSL_FLAG(int64_t, max_inflight_bytes, int64_t{1} << 30,
          "Most request bytes held by calls in progress (a REST request "
          "counts its declared body, a JSON body 16 times for its parse, "
          "before the body is read, and its reply); more get "
          "RESOURCE_EXHAUSTED (REST: 429) at once. A single request may "
          "always use up to --max_message_bytes when nothing else is in "
          "flight. 0: no limit.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain for TLS on the gRPC port (with --tls_key); "
          "empty: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: clients must present a certificate it signed "
          "(mTLS); needs --tls_cert/--tls_key.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token every call must send as gRPC "
          "metadata or HTTP header \"authorization: Bearer <token>\" "
          "(UNAUTHENTICATED, REST 401, otherwise; a REST body is then not "
          "read); health checks need none. Empty: no token.");
ABSL_FLAG(std::string, metrics_bind_address, "",
          "Address the metrics port listens on (e.g. 127.0.0.1 to keep "
          "/metrics private); empty: --bind_address.");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for durable BatchNorm state (snapshots + write-ahead "
          "log); every model change is acknowledged only once it is on disk "
          "and is recovered on restart. Empty: in-memory only, lost on exit.");
ABSL_FLAG(int64_t, snapshot_log_bytes, 64 << 20,
          "With --state_dir: write a snapshot (and drop the log it covers) "
          "once the write-ahead log has grown by this many bytes.");
ABSL_FLAG(int, malloc_arenas, 1,
          "glibc malloc arenas (M_ARENA_MAX) shared by all threads; 0: "
          "glibc's default (8 per core). One keeps a freed large buffer warm "
          "for the next thread that needs it: under 4 MiB requests it "
          "halves resident memory per byte in flight and raises throughput; "
          "raise it only if a profile shows malloc lock contention.");
ABSL_FLAG(int64_t, malloc_keep_freed_bytes, 64 << 20,
          "Freed memory glibc malloc keeps for the next request before it "
          "returns it to the kernel (M_TRIM_THRESHOLD); blocks up to 32 MiB "
          "then come from the heap, not from an mmap of their own. Without "
          "it (0: glibc's default) each request's receive and reply buffers "
          "fault in and are zeroed anew, which costs 5-15% of 4 MiB "
          "throughput. Resident memory stays up to this much above the "
          "live data after a burst.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(10),
          "On SIGINT/SIGTERM: health turns NOT_SERVING and new calls and "
          "connections are refused at once; calls in flight get this long "
          "to finish before they are cancelled, and REST connections still "
          "sending a request are cut then; then (with --state_dir) a final "
          "snapshot is written and normd exits 0.");

namespace {

const char kUsage[] =
    "a gRPC server that normalizes tensors (LayerNorm, RMSNorm, BatchNorm, "
    "GroupNorm,\nInstanceNorm; float32, float64, bfloat16, float16) with "
    "PyTorch semantics and keeps\nBatchNorm / InstanceNorm statistics per "
    "model, in memory or durably (--state_dir).\n\n"
    "Usage: normd [--port=50051] [--http_port=8000] [--metrics_port=9464] "
    "[--state_dir=DIR] [flags...]\n\n"
    "Services: normd.v1.Normalizer, inference.GRPCInferenceService (the Open "
    "Inference\nProtocol, KServe v2), grpc.health.v1.Health, server "
    "reflection; the Open Inference\nProtocol over REST on --http_port "
    "(GET /v2/health/ready, POST /v2/models/NAME/infer).\nSIGINT/SIGTERM: "
    "health goes NOT_SERVING, calls in flight "
    "drain (--shutdown_grace),\na final snapshot is written, exit 0.\n"
    "Environment: NORMD_SIMD_TARGET=avx3|avx2|sse4|sve|neon|scalar runs the "
    "kernels on\nthat SIMD target (default: the best this CPU has; every "
    "target gives the same\nbits; one the CPU lacks is a start-up error). "
    "The start-up line names the target.";

// Show only normd's own flags in --help.
bool IsNormdFlagFile(absl::string_view file) {
  return absl::StrContains(file, "server/main.cc");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = IsNormdFlagFile;
  usage_config.contains_helpshort_flags = IsNormdFlagFile;
  absl::SetFlagsUsageConfig(usage_config);
  absl::ParseCommandLine(argc, argv);
  if (absl::Status s = normd::RestrictSimdTargetFromEnvironment(); !s.ok()) {
    normd::Log(normd::LogSeverity::kError,
               absl::StrCat("cannot start: ", s.message()));
    return 1;
  }
  // Before any thread exists: arenas are made per thread on contention.
  if (absl::Status s = normd::ConfigureMalloc(normd::MallocConfig{
          .arenas = absl::GetFlag(FLAGS_malloc_arenas),
          .keep_freed_bytes = absl::GetFlag(FLAGS_malloc_keep_freed_bytes)});
      absl::IsInvalidArgument(s)) {
    normd::Log(normd::LogSeverity::kError,
               absl::StrCat("cannot start: ", s.message()));
    return 1;
  } else if (!s.ok()) {
    normd::Log(normd::LogSeverity::kWarning, s.message());
  }
  // protobuf logs an ERROR line for every request with invalid UTF-8 in a
  // string field; the client gets INVALID_ARGUMENT and the log stays quiet.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});

  // Block the stop signals in every thread; the main thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  normd::ServerOptions options;
  options.bind_address = absl::GetFlag(FLAGS_bind_address);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.http_port = absl::GetFlag(FLAGS_http_port);
  options.http_threads = absl::GetFlag(FLAGS_http_threads);
  options.http_max_connections = absl::GetFlag(FLAGS_http_max_connections);
  options.http_header_timeout = absl::GetFlag(FLAGS_http_header_timeout);
  options.http_idle_timeout = absl::GetFlag(FLAGS_http_idle_timeout);
  options.http_body_timeout = absl::GetFlag(FLAGS_http_body_timeout);
  options.http_min_body_rate = absl::GetFlag(FLAGS_http_min_body_rate);
  options.http_linger_timeout = absl::GetFlag(FLAGS_http_linger_timeout);
  options.http_max_header_bytes = absl::GetFlag(FLAGS_http_max_header_bytes);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.max_models = absl::GetFlag(FLAGS_max_models);
  options.max_num_features = absl::GetFlag(FLAGS_max_num_features);
  options.max_model_bytes = absl::GetFlag(FLAGS_max_model_bytes);
  options.max_rank = absl::GetFlag(FLAGS_max_rank);
  options.drift = {.buckets = absl::GetFlag(FLAGS_drift_buckets),
                   .bucket_seconds = absl::GetFlag(FLAGS_drift_bucket_seconds),
                   .sample_every = absl::GetFlag(FLAGS_drift_sample_every),
                   .min_samples = absl::GetFlag(FLAGS_drift_min_samples),
                   .threshold = absl::GetFlag(FLAGS_drift_threshold)};
  options.max_drift_models = absl::GetFlag(FLAGS_max_drift_models);
  options.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  options.tbb_threads = absl::GetFlag(FLAGS_tbb_threads);
  options.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  options.buffer_pool_bytes = absl::GetFlag(FLAGS_buffer_pool_bytes);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  options.metrics_bind_address = absl::GetFlag(FLAGS_metrics_bind_address);
  options.max_inflight_requests = absl::GetFlag(FLAGS_max_inflight_requests);
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.snapshot_log_bytes = absl::GetFlag(FLAGS_snapshot_log_bytes);

  auto server = normd::NormdServer::Start(options);
  if (!server.ok()) {
    normd::Log(normd::LogSeverity::kError,
               absl::StrCat("cannot start: ", server.status().message()));
    return 1;
  }
  normd::Log(
      normd::LogSeverity::kInfo,
      absl::StrCat(
          "serving gRPC on ", options.bind_address, ":", (*server)->port(),
          ", metrics on ",
          (*server)->metrics_port() < 0
              ? std::string("(disabled)")
              : absl::StrCat(options.metrics_bind_address.empty()
                                 ? options.bind_address
                                 : options.metrics_bind_address,
                             ":", (*server)->metrics_port(), "/metrics"),
          ", REST on ",
          (*server)->http_port() < 0
              ? std::string("(disabled)")
              : absl::StrCat(options.bind_address, ":", (*server)->http_port()),
          options.tls_cert.empty() ? "; plaintext"
          : options.tls_client_ca.empty()
              ? "; TLS"
              : "; TLS, client certificates required",
          options.auth_token_file.empty() ? "" : ", bearer token required",
          "; SIMD target ", normd::ActiveSimdTarget()));

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  normd::Log(normd::LogSeverity::kInfo,
             absl::StrCat("received ", strsignal(signal_number),
                          "; draining for up to ",
                          absl::FormatDuration(options.shutdown_grace)));
  (*server)->Shutdown();
  server->reset();
  normd::Log(normd::LogSeverity::kInfo, "stopped");
  return 0;
}

#include "server/rpc/metrics.h"

#include <string>

namespace normd {
namespace {

constexpr const char* kNative = "normd.v1.Normalizer";
constexpr const char* kOip = "inference.GRPCInferenceService";

struct MethodInfo {
  const char* service;
  const char* name;
  const char* type;  // grpc_type, as in go-grpc-prometheus.
};

constexpr MethodInfo kMethods[kNumRpcMethods] = {
    {kNative, "Normalize", "unary"},
    {kNative, "Fit", "unary"},
    {kNative, "CreateModel", "unary"},
    {kNative, "GetModel", "unary"},
    {kNative, "ListModels", "unary"},
    {kNative, "DeleteModel", "unary"},
    {kNative, "ResetModel", "unary"},
    {kNative, "NormalizeStream", "bidi_stream"},
    {kNative, "FitStream", "client_stream"},
    {kNative, "ExportModel", "unary"},
    {kNative, "ImportModel", "unary"},
    {kNative, "MergeModel", "unary"},
    {kNative, "CreateModels", "unary"},
    {kOip, "ServerLive", "unary"},
    {kOip, "ServerReady", "unary"},
    {kOip, "ModelReady", "unary"},
    {kOip, "ServerMetadata", "unary"},
    {kOip, "ModelMetadata", "unary"},
    {kOip, "ModelInfer", "unary"},
};

constexpr const char* kCodeNames[] = {
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
};

constexpr const char* kElementModes[kNumElementsModes] = {
    "layer_norm", "batch_norm_train", "batch_norm_eval",
    "fit",        "group_norm",       "instance_norm",
    "rms_norm",   "l2_norm",          "weight_norm"};

constexpr const char* kRestEndpoints[kNumRestEndpoints] = {
    "server_metadata", "health_live", "health_ready", "model_metadata",
    "model_ready",     "infer",       "unknown"};

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
  return *buckets;
}

}  // namespace

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
              "Time from a REST request's headers to its response, in "
              "seconds.")
          .Register(registry);
  for (int e = 0; e < kNumRestEndpoints; ++e) {
    seconds_[e] =
        &seconds.Add({{"endpoint", kRestEndpoints[e]}}, LatencyBuckets());
    for (int c = 0; c < kNumCodes; ++c) {
      requests_[e][c] = &requests.Add(
          {{"endpoint", kRestEndpoints[e]},
           {"code", c + 1 < kNumCodes ? std::to_string(kCodes[c]) : "other"}});
    }
  }
}

void HttpMetrics::Handled(RestEndpoint endpoint, int http_status,
                          double seconds) {
  const int e = static_cast<int>(endpoint);
  int c = 0;
  while (c + 1 < kNumCodes && kCodes[c] != http_status) ++c;
  requests_[e][c]->Increment();
  seconds_[e]->Observe(seconds);
}

ServerMetrics::ServerMetrics(prometheus::Registry& registry) {
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
  const prometheus::Histogram::BucketBoundaries& buckets = LatencyBuckets();
  for (int m = 0; m < kNumRpcMethods; ++m) {
    const prometheus::Labels labels = {{"grpc_service", kMethods[m].service},
                                       {"grpc_method", kMethods[m].name},
                                       {"grpc_type", kMethods[m].type}};
    started_[m] = &started.Add(labels);
    handling_seconds_[m] = &seconds.Add(labels, buckets);
    for (int c = 0; c < kNumCodes; ++c) {
      prometheus::Labels with_code = labels;
      with_code["grpc_code"] = kCodeNames[c];
      handled_[m][c] = &handled.Add(with_code);
    }
  }
  auto& elements = prometheus::BuildCounter()
                       .Name("normd_elements_total")
                       .Help("Tensor elements processed, by mode.")
                       .Register(registry);
  for (int e = 0; e < kNumElementsModes; ++e) {
    elements_[e] = &elements.Add({{"mode", kElementModes[e]}});
  }
  models_ = &prometheus::BuildGauge()
                 .Name("normd_models")
                 .Help("BatchNorm models held in memory.")
                 .Register(registry)
                 .Add({});
  model_bytes_ = &prometheus::BuildGauge()
                      .Name("normd_model_bytes")
                      .Help(
                          "Bytes the BatchNorm models are charged against "
                          "--max_model_bytes (each its full size, pooled "
                          "statistics included, from its creation).")
                      .Register(registry)
                      .Add({});
  model_bytes_limit_ = &prometheus::BuildGauge()
                            .Name("normd_max_model_bytes")
                            .Help("The --max_model_bytes limit.")
                            .Register(registry)
                            .Add({});
  open_streams_ = &prometheus::BuildGauge()
                       .Name("normd_open_streams")
                       .Help(
                           "NormalizeStream and FitStream calls open (idle "
                           "ones hold no --max_inflight_requests slot).")
                       .Register(registry)
                       .Add({});
  idle_streams_ended_ = &prometheus::BuildCounter()
                             .Name("normd_idle_streams_ended_total")
                             .Help(
                                 "Streams the server ended because their "
                                 "client sent or took nothing for "
                                 "--stream_idle_timeout.")
                             .Register(registry)
                             .Add({});
  inflight_ = &prometheus::BuildGauge()
                   .Name("normd_inflight_requests")
                   .Help("Normalizer RPCs in progress.")
                   .Register(registry)
                   .Add({});
  inflight_limit_ = &prometheus::BuildGauge()
                         .Name("normd_max_inflight_requests")
                         .Help(
                             "The --max_inflight_requests limit (0: none); "
                             "saturation is normd_inflight_requests over it.")
                         .Register(registry)
                         .Add({});
  rejected_ = &prometheus::BuildCounter()
                   .Name("normd_rejected_total")
                   .Help(
                       "Calls and stream messages refused with "
                       "RESOURCE_EXHAUSTED by --max_inflight_requests or "
                       "--max_inflight_bytes.")
                   .Register(registry)
                   .Add({});
}

void ServerMetrics::Started(RpcMethod method) {
  started_[static_cast<int>(method)]->Increment();
}

void ServerMetrics::Handled(RpcMethod method, grpc::StatusCode code,
                            double seconds) {
  const int c = static_cast<int>(code);
  const int m = static_cast<int>(method);
  handled_[m][(c >= 0 && c < kNumCodes) ? c : 2 /* Unknown */]->Increment();
  handling_seconds_[m]->Observe(seconds);
}

void ServerMetrics::AddElements(ElementsMode mode, int64_t count) {
  elements_[static_cast<int>(mode)]->Increment(static_cast<double>(count));
}

void ServerMetrics::SetModels(int64_t count, int64_t bytes) {
  models_->Set(static_cast<double>(count));
  model_bytes_->Set(static_cast<double>(bytes));
}

void ServerMetrics::SetModelBytesLimit(int64_t limit) {
  model_bytes_limit_->Set(static_cast<double>(limit));
}

void ServerMetrics::AddOpenStreams(double delta) {
  open_streams_->Increment(delta);
}

void ServerMetrics::IdleStreamEnded() { idle_streams_ended_->Increment(); }

void ServerMetrics::AddInflight(double delta) { inflight_->Increment(delta); }

void ServerMetrics::SetInflightLimit(int64_t limit) {
  inflight_limit_->Set(static_cast<double>(limit));
}

StateMetrics::StateMetrics(prometheus::Registry& registry) {
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter()
                .Name(name)
                .Help(help)
                .Register(registry)
                .Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge()
                .Name(name)
                .Help(help)
                .Register(registry)
                .Add({});
  };
  syncs_ = counter("normd_wal_syncs_total",
                   "Write-ahead log fdatasyncs (one per group commit).");
  records_ = counter("normd_wal_records_total",
                     "Model changes made durable in the write-ahead log.");
  bytes_ =
      counter("normd_wal_bytes_total", "Bytes written to the write-ahead log.");
  sync_seconds_ =
      &prometheus::BuildHistogram()
           .Name("normd_wal_sync_seconds")
           .Help("Time to write and fdatasync one group commit.")
           .Register(registry)
           .Add({}, prometheus::Histogram::BucketBoundaries{
                        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                        0.01, 0.025, 0.05, 0.1, 0.25, 1});
  snapshots_ = counter("normd_snapshots_total", "State snapshots written.");
  snapshot_bytes_ =
      gauge("normd_snapshot_bytes", "Size of the last snapshot written.");
  snapshot_seconds_ = gauge("normd_snapshot_seconds",
                            "Time the last snapshot took, in seconds.");
  writable_ = gauge("normd_state_writable",
                    "1 while model changes can be made durable; 0 once "
                    "writing the state failed (changes are refused).");
  writable_->Set(1);
}

void StateMetrics::OnFailure(const absl::Status& error) { writable_->Set(0); }

void StateMetrics::OnSync(int64_t records, int64_t bytes, double seconds) {
  syncs_->Increment();
  records_->Increment(static_cast<double>(records));
  bytes_->Increment(static_cast<double>(bytes));
  sync_seconds_->Observe(seconds);
}

void StateMetrics::OnSnapshot(int64_t bytes, double seconds) {
  snapshots_->Increment();
  snapshot_bytes_->Set(static_cast<double>(bytes));
  snapshot_seconds_->Set(seconds);
}

CallTracker::CallTracker(ServerMetrics& metrics, RpcMethod method)
    : metrics_(metrics),
      method_(method),
      start_(std::chrono::steady_clock::now()) {
  metrics_.Started(method_);
  metrics_.AddInflight(1);
}

CallTracker::~CallTracker() {
  if (!finished_) Finish(grpc::StatusCode::CANCELLED);
}

void CallTracker::Finish(grpc::StatusCode code) {
  if (finished_) return;
  finished_ = true;
  const std::chrono::duration<double> elapsed =
      std::chrono::steady_clock::now() - start_;
  metrics_.AddInflight(-1);
  metrics_.Handled(method_, code, elapsed.count());
}

}  // namespace normd

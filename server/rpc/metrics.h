// Prometheus metrics of the gRPC services and the REST front-end. Every family
// and every labelled handle is created once, in the constructor; the hot path
// only indexes cached pointers. Thread-safe (prometheus-cpp metrics are
// atomic). No label carries a model name or any other unbounded value.
#ifndef NORMD_SERVER_RPC_METRICS_H_
#define NORMD_SERVER_RPC_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <chrono>
#include <cstdint>

#include "grpcpp/support/status.h"
#include "server/state/durable_state.h"

namespace normd {

// The RPCs of normd.v1.Normalizer and of the Open Inference Protocol
// (inference.GRPCInferenceService), as metric label values.
enum class RpcMethod {
  kNormalize,
  kFit,
  kCreateModel,
  kGetModel,
  kListModels,
  kDeleteModel,
  kResetModel,
  kNormalizeStream,
  kFitStream,
  kExportModel,
  kImportModel,
  kMergeModel,
  kCreateModels,
  kServerLive,
  kServerReady,
  kModelReady,
  kServerMetadata,
  kModelMetadata,
  kModelInfer,
};
inline constexpr int kNumRpcMethods = 19;

// What normd_elements_total counts, as its `mode` label.
enum class ElementsMode {
  kLayerNorm,
  kBatchNormTrain,
  kBatchNormEval,
  kFit,
  kGroupNorm,
  kInstanceNorm,  // Stateless or with a model, training or eval.
  kRmsNorm,
  kL2Norm,
  kWeightNorm,
};
inline constexpr int kNumElementsModes = 9;

class ServerMetrics {
 public:
  explicit ServerMetrics(prometheus::Registry& registry);

  void Started(RpcMethod method);
  void Handled(RpcMethod method, grpc::StatusCode code, double seconds);
  void AddElements(ElementsMode mode, int64_t count);
  // The models held and the bytes they are charged (normd_model_bytes).
  void SetModels(int64_t count, int64_t bytes);
  void SetModelBytesLimit(int64_t limit);
  void AddOpenStreams(double delta);
  void IdleStreamEnded();
  void AddInflight(double delta);
  // The configured --max_inflight_requests (0: no limit), for saturation.
  void SetInflightLimit(int64_t limit);
  // A call or stream message refused by admission control.
  void Rejected() { rejected_->Increment(); }

 private:
  static constexpr int kNumCodes = 17;  // OK .. UNAUTHENTICATED.
  std::array<prometheus::Counter*, kNumRpcMethods> started_{};
  std::array<std::array<prometheus::Counter*, kNumCodes>, kNumRpcMethods>
      handled_{};
  std::array<prometheus::Histogram*, kNumRpcMethods> handling_seconds_{};
  std::array<prometheus::Counter*, kNumElementsModes> elements_{};
  prometheus::Gauge* models_ = nullptr;
  prometheus::Gauge* model_bytes_ = nullptr;
  prometheus::Gauge* model_bytes_limit_ = nullptr;
  prometheus::Gauge* open_streams_ = nullptr;
  prometheus::Counter* idle_streams_ended_ = nullptr;
  prometheus::Gauge* inflight_ = nullptr;
  prometheus::Gauge* inflight_limit_ = nullptr;
  prometheus::Counter* rejected_ = nullptr;
};

// The REST endpoints (server/http), as the `endpoint` label.
enum class RestEndpoint {
  kServerMetadata,
  kHealthLive,
  kHealthReady,
  kModelMetadata,
  kModelReady,
  kModelInfer,
  kUnknown,  // No endpoint: a wrong path, or a request httplib refused.
};
inline constexpr int kNumRestEndpoints = 7;

// normd_http_requests_total{endpoint,code} and
// normd_http_request_duration_seconds{endpoint}. The code label takes the
// statuses normd answers with, and "other" for any other. Thread-safe.
class HttpMetrics {
 public:
  explicit HttpMetrics(prometheus::Registry& registry);
  void Handled(RestEndpoint endpoint, int http_status, double seconds);

 private:
  static constexpr int kCodes[] = {200, 400, 401, 404, 405, 408, 413,
                                   414, 415, 429, 431, 500, 503};
  static constexpr int kNumCodes = sizeof(kCodes) / sizeof(kCodes[0]) + 1;
  std::array<std::array<prometheus::Counter*, kNumCodes>, kNumRestEndpoints>
      requests_{};
  std::array<prometheus::Histogram*, kNumRestEndpoints> seconds_{};
};

// Metrics of the durable state (--state_dir): write-ahead log syncs and the
// records each covered (group commit shows as records/syncs > 1), snapshots.
// Thread-safe.
class StateMetrics final : public state::DurabilityObserver {
 public:
  explicit StateMetrics(prometheus::Registry& registry);
  void OnSync(int64_t records, int64_t bytes, double seconds) override;
  void OnSnapshot(int64_t bytes, double seconds) override;
  void OnFailure(const absl::Status& error) override;

 private:
  prometheus::Gauge* writable_ = nullptr;
  prometheus::Counter* syncs_ = nullptr;
  prometheus::Counter* records_ = nullptr;
  prometheus::Counter* bytes_ = nullptr;
  prometheus::Histogram* sync_seconds_ = nullptr;
  prometheus::Counter* snapshots_ = nullptr;
  prometheus::Gauge* snapshot_bytes_ = nullptr;
  prometheus::Gauge* snapshot_seconds_ = nullptr;
};

// Tracks one call: counts it started and in flight on construction; Finish
// (once) records its code and duration. Not thread-safe; owned by one call.
class CallTracker {
 public:
  CallTracker(ServerMetrics& metrics, RpcMethod method);
  ~CallTracker();
  CallTracker(const CallTracker&) = delete;
  CallTracker& operator=(const CallTracker&) = delete;

  void Finish(grpc::StatusCode code);

 private:
  ServerMetrics& metrics_;
  const RpcMethod method_;
  const std::chrono::steady_clock::time_point start_;
  bool finished_ = false;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_METRICS_H_

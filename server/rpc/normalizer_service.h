// The normd.v1.Normalizer gRPC service (callback API). A thin front-end: it
// parses messages (convert.h), calls the Engine, formats the reply and maps
// the status (status_mapping.h); all numerics and state live in the core.
// Admission control counts calls and stream messages being processed; a
// stream waiting on its client holds no slot, and one that waits longer
// than --stream_idle_timeout is ended (StreamWatchdog).
//
// Thread-safe: gRPC invokes it from many threads at once; the Engine and the
// metrics are thread-safe, and each stream's reactor is driven by one
// callback at a time.
#ifndef NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_
#define NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "normd/v1/normalizer.grpc.pb.h"
#include "server/core/engine.h"
#include "server/rpc/admission.h"
#include "server/rpc/convert.h"
#include "server/rpc/metrics.h"
#include "server/rpc/stream_watchdog.h"

namespace normd {

// Every method on the callback API, raw: the service parses each request
// itself (raw_message.h).
using NormalizerServiceBase = v1::Normalizer::WithRawCallbackMethod_Normalize<
    v1::Normalizer::WithRawCallbackMethod_Fit<
        v1::Normalizer::WithRawCallbackMethod_CreateModel<
            v1::Normalizer::WithRawCallbackMethod_GetModel<
                v1::Normalizer::WithRawCallbackMethod_ListModels<
                    v1::Normalizer::WithRawCallbackMethod_DeleteModel<
                        v1::Normalizer::WithRawCallbackMethod_ResetModel<
                            v1::Normalizer::WithRawCallbackMethod_NormalizeStream<
                                v1::Normalizer::WithRawCallbackMethod_FitStream<
                                    v1::Normalizer::
                                        WithRawCallbackMethod_ExportModel<
                                            v1::Normalizer::WithRawCallbackMethod_ImportModel<
                                                v1::Normalizer::
                                                    WithRawCallbackMethod_MergeModel<
                                                        v1::Normalizer::WithRawCallbackMethod_CreateModels<
                                                            v1::Normalizer::
                                                                Service>>>>>>>>>>>>>;

// What the service needs to know of the server's configuration.
struct NormalizerServiceOptions {
  // The bearer token every call must carry in its "authorization" metadata
  // ("Bearer <token>"); empty: none needed.
  std::string auth_token;
  // The largest response gRPC will send (--max_message_bytes): a call whose
  // reply would be larger is refused before it changes anything.
  int64_t max_message_bytes = 64 << 20;
  // Streams waiting on their client this long are ended
  // (--stream_idle_timeout); zero: never.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
};

class NormalizerService final : public NormalizerServiceBase {
 public:
  NormalizerService(Engine& engine, ServerMetrics& metrics,
                    Admission& admission,
                    NormalizerServiceOptions options = {});

  using Raw = grpc::ByteBuffer;
  grpc::ServerUnaryReactor* Normalize(grpc::CallbackServerContext* context,
                                      const Raw* request,
                                      Raw* response) override;
  grpc::ServerUnaryReactor* Fit(grpc::CallbackServerContext* context,
                                const Raw* request, Raw* response) override;
  grpc::ServerUnaryReactor* CreateModel(grpc::CallbackServerContext* context,
                                        const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* CreateModels(grpc::CallbackServerContext* context,
                                         const Raw* request,
                                         Raw* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const Raw* request,
                                     Raw* response) override;
  grpc::ServerUnaryReactor* ListModels(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* DeleteModel(grpc::CallbackServerContext* context,
                                        const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* ResetModel(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* ExportModel(grpc::CallbackServerContext* context,
                                        const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* ImportModel(grpc::CallbackServerContext* context,
                                        const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* MergeModel(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;
  grpc::ServerBidiReactor<Raw, Raw>* NormalizeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<Raw>* FitStream(grpc::CallbackServerContext* context,
                                          Raw* response) override;

  // One Normalize / Fit, shared by the unary and streaming RPCs. DoNormalize
  // is the protobuf reference path.
  absl::Status DoNormalize(const v1::NormalizeRequest& request,
                           v1::NormalizeResponse& response);
  // Normalize on serialized bytes, as the unary RPC runs it: the input tensor
  // is read from the request's slices (gathered at most once) and the output
  // is computed straight into a buffer that becomes a response slice — no
  // protobuf copy of the tensor, no zero-fill. Byte-identical to serializing
  // DoNormalize's response.
  absl::Status DoNormalizeRaw(const grpc::ByteBuffer& request,
                              grpc::ByteBuffer& response);
  // The frame of a response around an output of `payload_bytes` written in
  // place (see ResponseFrame), given the output's dtype and shape and the
  // reply's other fields.
  using FrameFn = absl::FunctionRef<ResponseFrame(
      const v1::Tensor& output_meta, int64_t payload_bytes,
      const v1::NormalizeResponse& reply)>;
  // DoNormalizeRaw's computation of a parsed request whose input is not in
  // the values form: into this thread's scratch (small outputs) or a pooled
  // buffer that becomes a slice of `response` (large ones), framed by
  // `make_frame` (the Open Inference Protocol frames ModelInferResponses).
  absl::Status NormalizeFramed(const v1::NormalizeRequest& request,
                               const ParsedNormalize& parsed,
                               FrameFn make_frame, grpc::ByteBuffer& response);
  absl::Status DoFit(const v1::FitRequest& request, v1::FitResponse& response);
  // The model RPCs (see the .proto).
  absl::Status DoCreateModel(const v1::CreateModelRequest& request,
                             v1::ModelState& response);
  absl::Status DoCreateModels(const v1::CreateModelsRequest& request,
                              v1::CreateModelsResponse& response);
  absl::Status DoGetModel(const v1::GetModelRequest& request,
                          v1::ModelState& response);
  absl::Status DoListModels(const v1::ListModelsRequest& request,
                            v1::ListModelsResponse& response);
  absl::Status DoDeleteModel(const v1::DeleteModelRequest& request,
                             v1::DeleteModelResponse& response);
  absl::Status DoResetModel(const v1::ResetModelRequest& request,
                            v1::ModelState& response);
  absl::Status DoExportModel(const v1::ExportModelRequest& request,
                             v1::ModelState& response);
  absl::Status DoImportModel(const v1::ImportModelRequest& request,
                             v1::ModelState& response);
  absl::Status DoMergeModel(const v1::MergeModelRequest& request,
                            v1::ModelState& response);

  ServerMetrics& metrics() { return metrics_; }
  ModelStore& store() { return engine_.store(); }
  Admission& admission() { return admission_; }
  StreamWatchdog& watchdog() { return watchdog_; }

  // UNAUTHENTICATED unless the call carries the bearer token (OK when none
  // is configured).
  absl::Status Authenticate(const grpc::CallbackServerContext& context) const;

 private:
  // Computes a parsed request into `out` and fills `response`'s other fields
  // (request_id, model) and the metrics.
  absl::Status RunNormalize(const v1::NormalizeRequest& request,
                            const ParsedNormalize& parsed, void* out,
                            v1::NormalizeResponse& response);
  // RunNormalize with the output in `response` itself (data or values form,
  // as the request); `response` is left empty on failure.
  absl::Status NormalizeToMessage(const v1::NormalizeRequest& request,
                                  const ParsedNormalize& parsed,
                                  v1::NormalizeResponse& response);

  // RESOURCE_EXHAUSTED unless a reply of `bytes` fits --max_message_bytes;
  // checked before a call changes anything, so that a reply gRPC could not
  // send never follows a change the client is not told of.
  absl::Status CheckReplySize(int64_t bytes, absl::string_view what) const;
  // CheckReplySize for a reply that holds a ModelState of `channels`
  // channels named `name`, plus `other_bytes`.
  absl::Status CheckModelReplySize(int64_t channels, absl::string_view name,
                                   int64_t other_bytes) const;
  // Sets the models gauges from the store.
  void UpdateModelMetrics();

  // A received model state (ImportModel's model, MergeModel's source),
  // named `name` when that is not empty, validated (errors name the field
  // after `field`.) and within the server's num_features limit.
  absl::StatusOr<BatchNormModel> ParseModelState(const v1::ModelState& message,
                                                 absl::string_view name,
                                                 absl::string_view field);

  Engine& engine_;
  ServerMetrics& metrics_;
  Admission& admission_;
  const NormalizerServiceOptions options_;
  StreamWatchdog watchdog_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

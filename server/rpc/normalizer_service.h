// The normd.v1.Normalizer gRPC service (callback API). A front end that
// only translates: it parses messages (convert.h), runs the service's call
// on core types through the call lifecycle (grpc_call.h), formats the reply
// and maps the status (grpc_status.h); numerics, state, admission and
// limits are the service's. A stream's messages are admitted one at a time;
// a stream waiting on its client holds no slot, and one that waits longer
// than --stream_idle_timeout is ended (StreamWatchdog).
//
// Thread-safe: gRPC invokes it from many threads at once; the service is
// thread-safe, and each stream's reactor is driven by one callback at a
// time.
#ifndef NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_
#define NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "normd/v1/normalizer.grpc.pb.h"
#include "server/rpc/convert.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/stream_watchdog.h"
#include "server/service/service.h"

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
                                                                WithRawCallbackMethod_SetReference<
                                                                    v1::Normalizer::WithRawCallbackMethod_ClearReference<
                                                                        v1::Normalizer::
                                                                            Service>>>>>>>>>>>>>>>;

// What the gRPC service needs to know of the server's configuration.
struct NormalizerServiceOptions {
  // Streams waiting on their client this long are ended
  // (--stream_idle_timeout); zero: never.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
};

class NormalizerService final : public NormalizerServiceBase {
 public:
  // `front` must outlive the service.
  NormalizerService(GrpcFrontEnd front, NormalizerServiceOptions options = {});

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
  grpc::ServerUnaryReactor* SetReference(grpc::CallbackServerContext* context,
                                         const Raw* request,
                                         Raw* response) override;
  grpc::ServerUnaryReactor* ClearReference(grpc::CallbackServerContext* context,
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
  absl::Status DoFit(const v1::FitRequest& request, v1::FitResponse& response);
  // The model RPCs (see the .proto).
  absl::Status DoCreateModel(const v1::CreateModelRequest& request,
                             v1::ModelState& response);
  // `routed_group`: the x-normd-group header, when sent.
  absl::Status DoCreateModels(const v1::CreateModelsRequest& request,
                              v1::CreateModelsResponse& response,
                              const std::optional<std::string>& routed_group);
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
  absl::Status DoSetReference(const v1::SetReferenceRequest& request,
                              v1::ModelState& response);
  absl::Status DoClearReference(const v1::ClearReferenceRequest& request,
                                v1::ModelState& response);

  GrpcFrontEnd& front() { return front_; }
  // (Qualified: the generated base class has its own Service.)
  normd::Service& service() { return front_.service; }
  StreamWatchdog& watchdog() { return watchdog_; }

 private:
  // Computes a parsed request into `out` and fills `response`'s other fields
  // (request_id, model).
  absl::Status RunNormalize(const v1::NormalizeRequest& request,
                            const ParsedNormalize& parsed, void* out,
                            v1::NormalizeResponse& response);
  // RunNormalize with the output in `response` itself (data or values form,
  // as the request); `response` is left empty on failure.
  absl::Status NormalizeToMessage(const v1::NormalizeRequest& request,
                                  const ParsedNormalize& parsed,
                                  v1::NormalizeResponse& response);

  GrpcFrontEnd front_;
  StreamWatchdog watchdog_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

// The normd.v1.Normalizer gRPC service (callback API). A thin front-end: it
// parses messages (convert.h), calls the Engine, formats the reply and maps
// the status (status_mapping.h); all numerics and state live in the core.
//
// Thread-safe: gRPC invokes it from many threads at once; the Engine and the
// metrics are thread-safe, and each stream's reactor is driven by one
// callback at a time.
#ifndef NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_
#define NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "normd/v1/normalizer.grpc.pb.h"
#include "server/core/engine.h"
#include "server/rpc/admission.h"
#include "server/rpc/convert.h"
#include "server/rpc/metrics.h"

namespace normd {

// Every method on the callback API; Normalize is raw (see DoNormalizeRaw).
using NormalizerServiceBase = v1::Normalizer::WithRawCallbackMethod_Normalize<
    v1::Normalizer::WithCallbackMethod_Fit<
        v1::Normalizer::WithCallbackMethod_CreateModel<
            v1::Normalizer::WithCallbackMethod_GetModel<
                v1::Normalizer::WithCallbackMethod_ListModels<
                    v1::Normalizer::WithCallbackMethod_DeleteModel<
                        v1::Normalizer::WithCallbackMethod_ResetModel<
                            v1::Normalizer::WithCallbackMethod_NormalizeStream<
                                v1::Normalizer::WithCallbackMethod_FitStream<
                                    v1::Normalizer::WithCallbackMethod_ExportModel<
                                        v1::Normalizer::
                                            WithCallbackMethod_ImportModel<
                                                v1::Normalizer::
                                                    WithCallbackMethod_MergeModel<
                                                        v1::Normalizer::
                                                            Service>>>>>>>>>>>>;

class NormalizerService final : public NormalizerServiceBase {
 public:
  // `auth_token`: the bearer token every call must carry in its
  // "authorization" metadata ("Bearer <token>"); empty: none needed.
  NormalizerService(Engine& engine, ServerMetrics& metrics,
                    Admission& admission, std::string auth_token = "");

  grpc::ServerUnaryReactor* Normalize(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Fit(grpc::CallbackServerContext* context,
                                const v1::FitRequest* request,
                                v1::FitResponse* response) override;
  grpc::ServerUnaryReactor* CreateModel(grpc::CallbackServerContext* context,
                                        const v1::CreateModelRequest* request,
                                        v1::ModelState* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::ModelState* response) override;
  grpc::ServerUnaryReactor* ListModels(
      grpc::CallbackServerContext* context,
      const v1::ListModelsRequest* request,
      v1::ListModelsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteModel(
      grpc::CallbackServerContext* context,
      const v1::DeleteModelRequest* request,
      v1::DeleteModelResponse* response) override;
  grpc::ServerUnaryReactor* ResetModel(grpc::CallbackServerContext* context,
                                       const v1::ResetModelRequest* request,
                                       v1::ModelState* response) override;
  grpc::ServerUnaryReactor* ExportModel(grpc::CallbackServerContext* context,
                                        const v1::ExportModelRequest* request,
                                        v1::ModelState* response) override;
  grpc::ServerUnaryReactor* ImportModel(grpc::CallbackServerContext* context,
                                        const v1::ImportModelRequest* request,
                                        v1::ModelState* response) override;
  grpc::ServerUnaryReactor* MergeModel(grpc::CallbackServerContext* context,
                                       const v1::MergeModelRequest* request,
                                       v1::ModelState* response) override;
  grpc::ServerBidiReactor<v1::NormalizeRequest, v1::NormalizeResponse>*
  NormalizeStream(grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::FitRequest>* FitStream(
      grpc::CallbackServerContext* context, v1::FitResponse* response) override;

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
  // ExportModel, ImportModel and MergeModel (see the .proto).
  absl::Status DoExportModel(const v1::ExportModelRequest& request,
                             v1::ModelState& response);
  absl::Status DoImportModel(const v1::ImportModelRequest& request,
                             v1::ModelState& response);
  absl::Status DoMergeModel(const v1::MergeModelRequest& request,
                            v1::ModelState& response);

  ServerMetrics& metrics() { return metrics_; }
  ModelStore& store() { return engine_.store(); }
  Admission& admission() { return admission_; }

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

  // A received model state (ImportModel's model, MergeModel's source),
  // named `name` when that is not empty, validated (errors name the field
  // after `field`.) and within the server's num_features limit.
  absl::StatusOr<BatchNormModel> ParseModelState(const v1::ModelState& message,
                                                 absl::string_view name,
                                                 absl::string_view field);

  Engine& engine_;
  ServerMetrics& metrics_;
  Admission& admission_;
  const std::string auth_token_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

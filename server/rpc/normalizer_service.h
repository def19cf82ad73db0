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
#include "server/rpc/metrics.h"

namespace normd {

class NormalizerService final : public v1::Normalizer::CallbackService {
 public:
  NormalizerService(Engine& engine, ServerMetrics& metrics);

  grpc::ServerUnaryReactor* Normalize(grpc::CallbackServerContext* context,
                                      const v1::NormalizeRequest* request,
                                      v1::NormalizeResponse* response) override;
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
  grpc::ServerBidiReactor<v1::NormalizeRequest, v1::NormalizeResponse>*
  NormalizeStream(grpc::CallbackServerContext* context) override;
  grpc::ServerReadReactor<v1::FitRequest>* FitStream(
      grpc::CallbackServerContext* context, v1::FitResponse* response) override;

  // One Normalize / Fit, shared by the unary and streaming RPCs.
  absl::Status DoNormalize(const v1::NormalizeRequest& request,
                           v1::NormalizeResponse& response);
  absl::Status DoFit(const v1::FitRequest& request, v1::FitResponse& response);

  ServerMetrics& metrics() { return metrics_; }

 private:
  Engine& engine_;
  ServerMetrics& metrics_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_NORMALIZER_SERVICE_H_

// The Open Inference Protocol's gRPC service, inference.GRPCInferenceService
// (KServe v2), on normd's gRPC port beside normd.v1.Normalizer. A front-end
// that only translates (oip_convert.h): ModelInfer runs the native
// Normalize or Fit of the same request through the NormalizerService, with
// its admission, limits, bearer token, durability and metrics (under the
// OIP method names), and so its bytes and its errors. ServerLive and
// ServerReady need no token, as grpc.health; ServerReady follows the
// health service's status.
//
// Thread-safe: gRPC invokes it from many threads at once; everything it
// uses is thread-safe.
#ifndef NORMD_SERVER_RPC_OIP_SERVICE_H_
#define NORMD_SERVER_RPC_OIP_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/rpc/health_service.h"
#include "server/rpc/normalizer_service.h"

namespace normd {

// Every method raw: the service parses each request itself
// (raw_message.h), so that bytes that are not the message get
// INVALID_ARGUMENT.
using OipServiceBase =
    inference::GRPCInferenceService::WithRawCallbackMethod_ServerLive<
        inference::GRPCInferenceService::WithRawCallbackMethod_ServerReady<
            inference::GRPCInferenceService::WithRawCallbackMethod_ModelReady<
                inference::GRPCInferenceService::
                    WithRawCallbackMethod_ServerMetadata<
                        inference::GRPCInferenceService::
                            WithRawCallbackMethod_ModelMetadata<
                                inference::GRPCInferenceService::
                                    WithRawCallbackMethod_ModelInfer<
                                        inference::GRPCInferenceService::
                                            Service>>>>>>;

class OipService final : public OipServiceBase {
 public:
  // `native` and `health` must outlive the service.
  OipService(NormalizerService& native, HealthService& health);

  using Raw = grpc::ByteBuffer;
  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const Raw* request,
                                        Raw* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const Raw* request,
                                           Raw* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const Raw* request,
                                          Raw* response) override;
  grpc::ServerUnaryReactor* ModelInfer(grpc::CallbackServerContext* context,
                                       const Raw* request,
                                       Raw* response) override;

  // The methods on messages (the REST front-end calls them too).
  bool Ready();
  absl::Status DoModelReady(const inference::ModelReadyRequest& request,
                            inference::ModelReadyResponse& response);
  absl::Status DoServerMetadata(const inference::ServerMetadataRequest& request,
                                inference::ServerMetadataResponse& response);
  absl::Status DoModelMetadata(const inference::ModelMetadataRequest& request,
                               inference::ModelMetadataResponse& response);
  // Takes the request's raw contents (moved, not copied).
  absl::Status DoModelInfer(inference::ModelInferRequest& request,
                            inference::ModelInferResponse& response);
  // ModelInfer on serialized bytes, as the RPC runs it: the raw contents of
  // the input are read in place from the request's slices and the output is
  // computed into a buffer that becomes a slice of the response, as the
  // native raw Normalize does (no protobuf copy of either). The same bytes
  // and errors as DoModelInfer.
  absl::Status DoModelInferRaw(const grpc::ByteBuffer& request,
                               grpc::ByteBuffer& response);

 private:
  NormalizerService& native_;
  HealthService& health_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_OIP_SERVICE_H_

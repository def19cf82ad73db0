// The Open Inference Protocol's gRPC service, inference.GRPCInferenceService
// (KServe v2), on normd's gRPC port beside normd.v1.Normalizer. A front end
// that only translates (oip_convert.h) into the service's protocol-free
// Inference (server/service/inference.h), through the same call lifecycle as
// every gRPC method (grpc_call.h): the bearer token, admission, durability
// and metrics under the OIP method names. ServerLive and ServerReady need
// no token, as grpc.health.
//
// Thread-safe: gRPC invokes it from many threads at once; everything it
// uses is thread-safe.
#ifndef NORMD_SERVER_RPC_OIP_SERVICE_H_
#define NORMD_SERVER_RPC_OIP_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "server/rpc/grpc_call.h"
#include "server/service/inference.h"

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
  // `front` and `inference` must outlive the service.
  OipService(GrpcFrontEnd front, Inference& inference);

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

  // The methods on messages.
  absl::Status DoModelReady(const inference::ModelReadyRequest& request,
                            inference::ModelReadyResponse& response);
  absl::Status DoServerMetadata(const inference::ServerMetadataRequest& request,
                                inference::ServerMetadataResponse& response);
  absl::Status DoModelMetadata(const inference::ModelMetadataRequest& request,
                               inference::ModelMetadataResponse& response);
  // The protobuf reference path of ModelInfer.
  absl::Status DoModelInfer(const inference::ModelInferRequest& request,
                            inference::ModelInferResponse& response);
  // ModelInfer on serialized bytes, as the RPC runs it: the raw contents of
  // the inputs are read in place from the request's slices and the output is
  // computed into a buffer that becomes a slice of the response, as the
  // native raw Normalize does (no protobuf copy of either). The same bytes
  // and errors as DoModelInfer.
  absl::Status DoModelInferRaw(const grpc::ByteBuffer& request,
                               grpc::ByteBuffer& response);

 private:
  GrpcFrontEnd front_;
  Inference& inference_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_OIP_SERVICE_H_

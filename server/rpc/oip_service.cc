#include "server/rpc/oip_service.h"

#include "server/core/model.h"
#include "server/rpc/oip_convert.h"
#include "server/rpc/unary_call.h"

namespace normd {

using inference::ModelInferRequest;
using inference::ModelInferResponse;

OipService::OipService(NormalizerService& native, HealthService& health)
    : native_(native), health_(health) {}

bool OipService::Ready() { return health_.IsServing(""); }

absl::Status OipService::DoModelReady(
    const inference::ModelReadyRequest& request,
    inference::ModelReadyResponse& response) {
  const bool ready =
      CheckOipVersion(request.version(), request.name(), "version").ok() &&
      (BuiltinOipModel(request.name()).has_value() ||
       (ValidateModelName(request.name(), "name").ok() &&
        native_.store().Get(request.name()).ok()));
  response.set_ready(ready);
  return absl::OkStatus();
}

absl::Status OipService::DoServerMetadata(
    const inference::ServerMetadataRequest&,
    inference::ServerMetadataResponse& response) {
  response.set_name("normd");
  response.set_version(NORMD_VERSION);
  return absl::OkStatus();
}

absl::Status OipService::DoModelMetadata(
    const inference::ModelMetadataRequest& request,
    inference::ModelMetadataResponse& response) {
  if (BuiltinOipModel(request.name()).has_value()) {
    if (absl::Status s =
            CheckOipVersion(request.version(), request.name(), "version");
        !s.ok()) {
      return s;
    }
    OipModelMetadata(request.name(), std::nullopt, response);
    return absl::OkStatus();
  }
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = native_.store().Get(request.name());
  if (!model.ok()) return model.status();
  if (absl::Status s =
          CheckOipVersion(request.version(), request.name(), "version");
      !s.ok()) {
    return s;
  }
  OipModelMetadata(request.name(), model->num_features, response);
  return absl::OkStatus();
}

absl::Status OipService::DoModelInfer(ModelInferRequest& request,
                                      ModelInferResponse& response) {
  NativeInferCall call;
  if (absl::Status s = ToNativeInfer(request, call); !s.ok()) return s;
  if (call.fit) {
    v1::FitResponse reply;
    if (absl::Status s = native_.DoFit(call.fit_request, reply); !s.ok()) {
      return s;
    }
    FromNativeFit(request, reply, response);
    return absl::OkStatus();
  }
  v1::NormalizeResponse reply;
  if (absl::Status s = native_.DoNormalize(call.normalize, reply); !s.ok()) {
    return s;
  }
  FromNativeNormalize(request, call, reply, response);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* OipService::ServerLive(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunParsed<inference::ServerLiveRequest, inference::ServerLiveResponse>(
      context, native_, RpcMethod::kServerLive, "ServerLive", request, response,
      {.authenticate = false},
      [](const inference::ServerLiveRequest&,
         inference::ServerLiveResponse& reply) {
        reply.set_live(true);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipService::ServerReady(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunParsed<inference::ServerReadyRequest,
                   inference::ServerReadyResponse>(
      context, native_, RpcMethod::kServerReady, "ServerReady", request,
      response, {.authenticate = false},
      [this](const inference::ServerReadyRequest&,
             inference::ServerReadyResponse& reply) {
        reply.set_ready(Ready());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipService::ModelReady(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(context, native_, RpcMethod::kModelReady, "ModelReady",
                   request, response, {}, *this, &OipService::DoModelReady);
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(context, native_, RpcMethod::kServerMetadata,
                   "ServerMetadata", request, response, {}, *this,
                   &OipService::DoServerMetadata);
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(context, native_, RpcMethod::kModelMetadata, "ModelMetadata",
                   request, response, {}, *this, &OipService::DoModelMetadata);
}

grpc::ServerUnaryReactor* OipService::ModelInfer(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(context, native_, RpcMethod::kModelInfer, "ModelInfer",
                   request, response, {.offload = true}, *this,
                   &OipService::DoModelInfer);
}

}  // namespace normd

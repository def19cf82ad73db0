#include "server/rpc/oip_service.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/core/model.h"
#include "server/rpc/convert.h"
#include "server/rpc/oip_convert.h"
#include "server/rpc/raw_message.h"
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
  // Triton's binary-data extension of the REST form (server/http).
  response.add_extensions("binary_tensor_data");
  return absl::OkStatus();
}

absl::Status OipService::DoModelMetadata(
    const inference::ModelMetadataRequest& request,
    inference::ModelMetadataResponse& response) {
  // A store model: its channels (a malformed name first, then NOT_FOUND).
  std::optional<int64_t> num_features;
  if (!BuiltinOipModel(request.name()).has_value()) {
    if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
      return s;
    }
    absl::StatusOr<BatchNormModel> model = native_.store().Get(request.name());
    if (!model.ok()) return model.status();
    num_features = model->num_features;
  }
  if (absl::Status s =
          CheckOipVersion(request.version(), request.name(), "version");
      !s.ok()) {
    return s;
  }
  OipModelMetadata(request.name(), num_features, response);
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

absl::Status OipService::DoModelInferRaw(const grpc::ByteBuffer& request,
                                         grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> chunks;
  if (absl::Status s = SliceViews(request, slices, chunks); !s.ok()) return s;
  std::string rest;
  std::vector<WireEntry> entries;
  ModelInferRequest message;
  const bool split =
      SplitTopLevelField(chunks, kRawInputContentsField, rest, entries) &&
      message.ParseFromString(rest);
  // The entry of the input named "input", read in place.
  int input_entry = -1;
  for (int i = 0; split && i < message.inputs_size() && input_entry < 0; ++i) {
    if (message.inputs(i).name() == "input") input_entry = i;
  }
  const bool in_place =
      input_entry >= 0 && input_entry < static_cast<int>(entries.size());
  if (!split) {  // Malformed here: protobuf names what is wrong.
    if (absl::Status s = ParseMessage(request, message); !s.ok()) return s;
  }
  // The entries not read in place (weight, bias: small; all of them for
  // the protobuf path) are copied into the message.
  for (int i = 0; split && i < static_cast<int>(entries.size()); ++i) {
    std::string& bytes = *message.add_raw_input_contents();
    if (in_place && i == input_entry) continue;
    bytes.resize(static_cast<size_t>(entries[i].pieces.size()));
    entries[i].pieces.CopyOut(0, entries[i].pieces.size(), bytes.data());
  }
  if (!in_place) {  // Typed contents, or no input to read in place.
    ModelInferResponse reply;
    if (absl::Status s = DoModelInfer(message, reply); !s.ok()) return s;
    return SerializeMessage(reply, response);
  }
  NativeInferCall call;
  if (absl::Status s = ToNativeInfer(message, call); !s.ok()) return s;
  WireEntry& input = entries[input_entry];
  if (call.fit) {  // No output; the input copied, as DoModelInfer has it.
    std::string& data = *call.fit_request.mutable_input()->mutable_data();
    data.resize(static_cast<size_t>(input.pieces.size()));
    input.pieces.CopyOut(0, input.pieces.size(), data.data());
    v1::FitResponse fitted;
    if (absl::Status s = native_.DoFit(call.fit_request, fitted); !s.ok()) {
      return s;
    }
    ModelInferResponse reply;
    FromNativeFit(message, fitted, reply);
    return SerializeMessage(reply, response);
  }
  SplitRequest native;
  native.message = std::move(call.normalize);
  if (input.contiguous.has_value() &&
      reinterpret_cast<uintptr_t>(input.contiguous->data()) % sizeof(double) ==
          0) {
    native.input_data = input.contiguous;
  } else {
    native.scattered = std::move(input.pieces);  // See GatherInput.
  }
  ParsedNormalize parsed;
  if (absl::Status s = ParseNormalizeRequest(
          native.message, parsed, native.input_data,
          native.scattered.has_value() ? &*native.scattered : nullptr);
      !s.ok()) {
    return s;
  }
  if (!Engine::ReadsScatteredInPlace(parsed.spec)) GatherInput(native, parsed);
  return native_.NormalizeFramed(
      native.message, parsed,
      [&](const v1::Tensor& meta, int64_t bytes,
          const v1::NormalizeResponse& reply) {
        return ResponseFrame{
            .head = OipRawResponseHead(message, call, meta, bytes, reply),
            .tail = ""};
      },
      response);
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
  return RunUnary(context, native_, RpcMethod::kModelInfer, "ModelInfer",
                  *request, {.offload = true}, [this, request, response] {
                    return DoModelInferRaw(*request, *response);
                  });
}

}  // namespace normd

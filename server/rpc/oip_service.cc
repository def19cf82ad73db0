#include "server/rpc/oip_service.h"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/rpc/convert.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/oip_convert.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/reply_payload.h"

namespace normd {
namespace {

using inference::ModelInferRequest;
using inference::ModelInferResponse;

// An infer call's reply and the output it computed.
struct ComputedInfer {
  InferReply reply;
  std::optional<ReplyPayload> payload;
};

// What a raw infer call builds on its way: the parsed message without its
// raw contents, their places in the request's slices, the service's request
// and the reply's head.
struct InferScratch {
  ModelInferRequest message;
  std::vector<WireEntry> entries;
  std::vector<TensorBytes> raw;
  InferRequest request;
  std::vector<std::string> typed;
  std::string head;
};

// Requests up to this size are built in their thread's InferScratch, kept
// from call to call: protobuf keeps a cleared message's strings and
// repeated fields, and a vector its capacity, so a warm thread parses a
// small request without allocating. Larger ones get their own, freed with
// the call, so that no thread keeps a large request's memory.
constexpr size_t kReusedScratchBytes = 64 << 10;

// Runs `message` (its raw contents `raw`) through `inference` as `request`,
// the output computed into a ReplyPayload.
absl::Status RunInfer(Inference& inference, const ModelInferRequest& message,
                      absl::Span<const TensorBytes> raw,
                      std::vector<std::string>& typed, InferRequest& request,
                      ComputedInfer& computed) {
  if (absl::Status s = ToInferRequest(message, raw, typed, request); !s.ok()) {
    return s;
  }
  absl::StatusOr<InferReply> reply = inference.Infer(
      request,
      [&](const InferOutputPlan& plan) -> absl::StatusOr<OutputPlacement> {
        computed.payload.emplace(plan.bytes);
        // The reply: the output, its name, datatype and shape, the model's
        // counters and the request's names.
        const int64_t head = 96 + 11 * static_cast<int64_t>(plan.shape.size()) +
                             static_cast<int64_t>(message.model_name().size() +
                                                  message.id().size());
        return OutputPlacement{.data = computed.payload->data(),
                               .reply = ReplySize{.bytes = plan.bytes + head,
                                                  .with_model_arrays = false}};
      });
  if (!reply.ok()) return reply.status();
  computed.reply = *std::move(reply);
  return absl::OkStatus();
}

absl::string_view OutputBytes(ComputedInfer& computed) {
  return absl::string_view(static_cast<const char*>(computed.payload->data()),
                           static_cast<size_t>(computed.reply.output.bytes));
}

// ModelInfer of the serialized `request`, built in `scratch`.
absl::Status InferRaw(Inference& inference, const grpc::ByteBuffer& request,
                      InferScratch& scratch, grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> chunks;
  if (absl::Status s = SliceViews(request, slices, chunks); !s.ok()) return s;
  // The raw contents stay where they lie in the slices; the rest is parsed.
  ModelInferRequest& message = scratch.message;
  std::vector<TensorBytes>& raw = scratch.raw;
  scratch.head.clear();
  scratch.entries.clear();
  raw.clear();
  if (SplitTopLevelField(chunks, kRawInputContentsField, scratch.head,
                         scratch.entries) &&
      message.ParseFromString(scratch.head)) {
    for (const WireEntry& entry : scratch.entries) {
      raw.push_back(entry.contiguous.has_value()
                        ? TensorBytes{.contiguous = entry.contiguous,
                                      .scattered = nullptr}
                        : TensorBytes{.contiguous = std::nullopt,
                                      .scattered = &entry.pieces});
    }
  } else {  // Malformed here: protobuf says what it is.
    message.Clear();
    if (absl::Status s = ParseMessage(request, message); !s.ok()) return s;
    raw = RawContentsOf(message);
  }
  ComputedInfer computed;
  if (absl::Status s = RunInfer(inference, message, raw, scratch.typed,
                                scratch.request, computed);
      !s.ok()) {
    return s;
  }
  if (raw.empty()) {  // Typed contents in, typed contents out.
    ModelInferResponse reply;
    ToModelInferResponse(message, computed.reply, OutputBytes(computed),
                         /*raw=*/false, reply);
    return SerializeMessage(reply, response);
  }
  OipRawResponseHead(message, computed.reply, scratch.head);
  response = computed.payload->Assemble(scratch.head, "");
  return absl::OkStatus();
}

}  // namespace

OipService::OipService(GrpcFrontEnd front, Inference& inference)
    : front_(front), inference_(inference) {}

absl::Status OipService::DoModelReady(
    const inference::ModelReadyRequest& request,
    inference::ModelReadyResponse& response) {
  response.set_ready(inference_.ModelReady(request.name(), request.version()));
  return absl::OkStatus();
}

absl::Status OipService::DoServerMetadata(
    const inference::ServerMetadataRequest&,
    inference::ServerMetadataResponse& response) {
  const OipServerMetadata metadata = inference_.ServerMetadata();
  response.set_name(metadata.name);
  response.set_version(metadata.version);
  for (const std::string& extension : metadata.extensions) {
    response.add_extensions(extension);
  }
  return absl::OkStatus();
}

absl::Status OipService::DoModelMetadata(
    const inference::ModelMetadataRequest& request,
    inference::ModelMetadataResponse& response) {
  absl::StatusOr<OipModelMetadata> metadata =
      inference_.ModelMetadata(request.name(), request.version());
  if (!metadata.ok()) return metadata.status();
  ToModelMetadataResponse(*metadata, response);
  return absl::OkStatus();
}

absl::Status OipService::DoModelInfer(const ModelInferRequest& request,
                                      ModelInferResponse& response) {
  const std::vector<TensorBytes> raw = RawContentsOf(request);
  std::vector<std::string> typed;
  InferRequest infer;
  ComputedInfer computed;
  if (absl::Status s =
          RunInfer(inference_, request, raw, typed, infer, computed);
      !s.ok()) {
    return s;
  }
  ToModelInferResponse(request, computed.reply, OutputBytes(computed),
                       !raw.empty(), response);
  return absl::OkStatus();
}

absl::Status OipService::DoModelInferRaw(const grpc::ByteBuffer& request,
                                         grpc::ByteBuffer& response) {
  if (request.Length() <= kReusedScratchBytes) {
    thread_local InferScratch scratch;
    return InferRaw(inference_, request, scratch, response);
  }
  InferScratch scratch;
  return InferRaw(inference_, request, scratch, response);
}

grpc::ServerUnaryReactor* OipService::ServerLive(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunParsed<inference::ServerLiveRequest, inference::ServerLiveResponse>(
      front_, Protocol::kOipGrpc, Method::kServerLive, context, request,
      response, {.authenticate = false},
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
      front_, Protocol::kOipGrpc, Method::kServerReady, context, request,
      response, {.authenticate = false},
      [this](const inference::ServerReadyRequest&,
             inference::ServerReadyResponse& reply) {
        reply.set_ready(inference_.Ready());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* OipService::ModelReady(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(front_, Protocol::kOipGrpc, Method::kModelReady, context,
                   request, response, {}, *this, &OipService::DoModelReady);
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(front_, Protocol::kOipGrpc, Method::kServerMetadata, context,
                   request, response, {}, *this, &OipService::DoServerMetadata);
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunMember(front_, Protocol::kOipGrpc, Method::kModelMetadata, context,
                   request, response, {}, *this, &OipService::DoModelMetadata);
}

grpc::ServerUnaryReactor* OipService::ModelInfer(
    grpc::CallbackServerContext* context, const Raw* request, Raw* response) {
  return RunUnary(front_, Protocol::kOipGrpc, Method::kModelInfer, context,
                  *request, {.offload = true}, [this, request, response] {
                    return DoModelInferRaw(*request, *response);
                  });
}

}  // namespace normd

#include "server/rpc/oip_service.h"

#include <cstdint>
#include <memory>
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

namespace {

// What DoModelInferRaw reads a request into, one set per thread and reused
// from call to call: protobuf keeps a cleared message's strings and repeated
// fields, and a vector its capacity, so that a warm thread reads the small
// head of a request without allocating. A call takes its thread's set out of
// the slot (a nested call would make its own) and puts it back only when
// told to: after a normalize that read its input in place and left little
// in the set, so that no thread holds on to a large tensor's memory.
struct RawInferScratch {
  std::vector<grpc::Slice> slices;  // The request's: released after a call.
  std::vector<absl::string_view> chunks;
  std::string head;  // The request without its raw_input_contents.
  std::vector<WireEntry> entries;
  ModelInferRequest message;
  NativeInferCall call;
};

// The most a set kept for the next call may hold of a request's bytes (its
// head and the entries copied into the message: weight and bias).
constexpr int64_t kMaxReusedBytes = 64 << 10;

// This thread's RawInferScratch for one call, cleared.
class RawInferScratchLease {
 public:
  RawInferScratchLease() : scratch_(std::move(Slot())) {
    if (scratch_ == nullptr) scratch_ = std::make_unique<RawInferScratch>();
  }
  ~RawInferScratchLease() {
    if (!keep_) return;
    scratch_->slices.clear();
    scratch_->chunks.clear();
    scratch_->head.clear();
    scratch_->entries.clear();
    scratch_->message.Clear();
    scratch_->call.Clear();
    Slot() = std::move(scratch_);
  }
  RawInferScratchLease(const RawInferScratchLease&) = delete;
  RawInferScratchLease& operator=(const RawInferScratchLease&) = delete;

  RawInferScratch* operator->() { return scratch_.get(); }
  // Puts the set back for this thread's next call.
  void KeepForNextCall() { keep_ = true; }

 private:
  static std::unique_ptr<RawInferScratch>& Slot() {
    thread_local std::unique_ptr<RawInferScratch> slot;
    return slot;
  }

  std::unique_ptr<RawInferScratch> scratch_;
  bool keep_ = false;
};

}  // namespace

absl::Status OipService::DoModelInferRaw(const grpc::ByteBuffer& request,
                                         grpc::ByteBuffer& response) {
  RawInferScratchLease scratch;
  if (absl::Status s = SliceViews(request, scratch->slices, scratch->chunks);
      !s.ok()) {
    return s;
  }
  std::vector<WireEntry>& entries = scratch->entries;
  ModelInferRequest& message = scratch->message;
  const bool split = SplitTopLevelField(scratch->chunks, kRawInputContentsField,
                                        scratch->head, entries) &&
                     message.ParseFromString(scratch->head);
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
  int64_t copied_bytes = 0;
  for (int i = 0; split && i < static_cast<int>(entries.size()); ++i) {
    std::string& bytes = *message.add_raw_input_contents();
    if (in_place && i == input_entry) continue;
    bytes.resize(static_cast<size_t>(entries[i].pieces.size()));
    entries[i].pieces.CopyOut(0, entries[i].pieces.size(), bytes.data());
    copied_bytes += entries[i].pieces.size();
  }
  if (!in_place) {  // Typed contents, or no input to read in place.
    ModelInferResponse reply;
    if (absl::Status s = DoModelInfer(message, reply); !s.ok()) return s;
    return SerializeMessage(reply, response);
  }
  NativeInferCall& call = scratch->call;
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
  std::optional<absl::string_view> input_data;
  if (input.contiguous.has_value() &&
      reinterpret_cast<uintptr_t>(input.contiguous->data()) % sizeof(double) ==
          0) {
    input_data = input.contiguous;
  }
  ParsedNormalize parsed;
  if (absl::Status s = ParseNormalizeRequest(
          call.normalize, parsed, input_data,
          input_data.has_value() ? nullptr : &input.pieces);
      !s.ok()) {
    return s;
  }
  PooledBuffer gathered(nullptr, &BufferPool::Release);
  if (!Engine::ReadsScatteredInPlace(parsed.spec)) {
    GatherInput(parsed, gathered);
  }
  const absl::Status status = native_.NormalizeFramed(
      call.normalize, parsed,
      [&](const v1::Tensor& meta, int64_t bytes,
          const v1::NormalizeResponse& reply) {
        return ResponseFrame{
            .head = OipRawResponseHead(message, call, meta, bytes, reply),
            .tail = ""};
      },
      response);
  if (static_cast<int64_t>(scratch->head.size()) + copied_bytes <=
      kMaxReusedBytes) {
    scratch.KeepForNextCall();
  }
  return status;
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

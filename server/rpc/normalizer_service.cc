#include "server/rpc/normalizer_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/parallel.h"
#include "server/rpc/answering_stream.h"
#include "server/rpc/auth.h"
#include "server/rpc/convert.h"
#include "server/rpc/logging.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/status_mapping.h"
#include "server/rpc/unary_call.h"

namespace normd {
namespace {

// Outputs up to this size are sent as one slice with the response's other
// fields (a copy is cheaper than the extra allocations); larger ones are
// computed in place into their own slice.
constexpr int64_t kSmallOutputBytes = 64 << 10;

// NormalizeStream: read a message, answer it, read the next; responses go
// out in request order. A failed message, one that is not a
// NormalizeRequest included, gets a response whose `error` says why, and the
// stream goes on. Each message is admitted while it is computed; while the
// stream waits on its client it holds no slot, and the watchdog ends it if
// that lasts past --stream_idle_timeout.
class NormalizeStreamReactor final : public AnsweringStream {
 public:
  NormalizeStreamReactor(NormalizerService& service,
                         const grpc::CallbackServerContext& context)
      : AnsweringStream(service.watchdog()),
        service_(service),
        tracker_(service.metrics(), RpcMethod::kNormalizeStream) {
    service_.metrics().AddOpenStreams(1);
    if (absl::Status s = service.Authenticate(context); !s.ok()) {
      FinishOnce(s);
      return;
    }
    Start();
  }

 private:
  void Answer(const grpc::ByteBuffer& raw_request) override {
    ++messages_;
    request_.Clear();
    response_.Clear();
    absl::StatusOr<Admission::Ticket> ticket = service_.admission().Admit(
        1, static_cast<int64_t>(raw_request.Length()));
    if (!ticket.ok()) service_.metrics().Rejected();
    absl::Status status = ticket.status();
    uint64_t sequence = 0;
    if (status.ok()) status = ParseMessage(raw_request, request_);
    if (status.ok()) {
      DeferDurability defer;
      status =
          Guarded([&] { return service_.DoNormalize(request_, response_); });
      sequence = defer.sequence();
    }
    ticket = Admission::Ticket();  // Released: only the write is left.
    // A training step is answered once it is durable (from the log's
    // thread; at once otherwise).
    service_.store().OnDurable(
        status.ok() ? sequence : 0,
        [this, status](const absl::Status& durable) {
          const absl::Status final_status = durable.ok() ? status : durable;
          if (!final_status.ok()) {
            response_.Clear();
            response_.set_request_id(request_.request_id());
            const grpc::Status bounded = ToGrpcStatus(final_status);
            response_.mutable_error()->set_code(bounded.error_code());
            response_.mutable_error()->set_message(bounded.error_message());
          }
          Reply(response_);
        });
  }
  absl::Status OnIdleEnd(const absl::Status& status) override {
    service_.metrics().IdleStreamEnded();
    return absl::Status(status.code(), absl::StrCat(status.message(), " after ",
                                                    messages_, " messages"));
  }
  void OnFinishing(const grpc::Status& status) override {
    tracker_.Finish(status.error_code());
  }
  void OnClosed() override { service_.metrics().AddOpenStreams(-1); }

  NormalizerService& service_;
  CallTracker tracker_;
  v1::NormalizeRequest request_;
  v1::NormalizeResponse response_;
  int64_t messages_ = 0;  // Read so far.
};

// FitStream: each message is one Fit step, applied as it arrives. The reply
// (the model after the last step) is sent when the client half-closes, once
// every step is durable; a failing message (one that is not a FitRequest
// included) ends the call with its error, naming its index and how many
// steps before it were applied (also once those are durable). Admission and
// idleness as NormalizeStream.
class FitStreamReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer>,
                               public IdleStream {
 public:
  FitStreamReactor(NormalizerService& service,
                   const grpc::CallbackServerContext& context,
                   grpc::ByteBuffer* response)
      : service_(service),
        response_(response),
        tracker_(service.metrics(), RpcMethod::kFitStream) {
    service_.metrics().AddOpenStreams(1);
    service_.watchdog().Add(this);
    if (absl::Status s = service.Authenticate(context); !s.ok()) {
      FinishOnce(s);
      return;
    }
    ReadNext();
  }

  void OnReadDone(bool ok) override {
    if (!StartWorking()) return;  // Ended meanwhile (idle).
    if (!ok) {                    // The client half-closed (or the call broke).
      absl::Status status =
          steps_ > 0 ? SerializeMessage(reply_, *response_)
                     : absl::InvalidArgumentError(
                           "FitStream: the stream carried no FitRequest");
      FinishOnce(status);
      return;
    }
    absl::StatusOr<Admission::Ticket> ticket = service_.admission().Admit(
        1, static_cast<int64_t>(raw_request_.Length()));
    if (!ticket.ok()) service_.metrics().Rejected();
    absl::Status status = ticket.status();
    if (status.ok()) status = ParseMessage(raw_request_, request_);
    if (status.ok()) {
      DeferDurability defer;
      status = Guarded([&] { return service_.DoFit(request_, reply_); });
      durable_after_ = std::max(durable_after_, defer.sequence());
    }
    if (!status.ok()) {
      FinishOnce(absl::Status(
          status.code(),
          absl::StrCat("FitStream message ", steps_, ": ", status.message(),
                       "; the ", steps_, " steps before it are applied")));
      return;
    }
    ++steps_;
    ticket = Admission::Ticket();
    ReadNext();
  }

  void OnDone() override {
    service_.watchdog().Remove(this);
    service_.metrics().AddOpenStreams(-1);
    delete this;
  }

 private:
  void ReadNext() {
    request_.Clear();
    StartWaiting(Waiting::kForMessage, [&] { StartRead(&raw_request_); });
  }
  void FinishOnce(const absl::Status& status) {
    if (ClaimFinish()) FinishWith(status);
  }
  void FinishIdle(const absl::Status& status) override {
    service_.metrics().IdleStreamEnded();
    FinishWith(absl::Status(status.code(),
                            absl::StrCat(status.message(), "; the ", steps_,
                                         " steps it carried are applied")));
  }
  // Finishes once the steps applied so far are durable.
  void FinishWith(const absl::Status& status) {
    service_.store().OnDurable(
        durable_after_, [this, status](const absl::Status& durable) {
          const grpc::Status grpc_status =
              ToGrpcStatus(durable.ok() ? status : durable);
          LogIfServerFault("FitStream", grpc_status);
          tracker_.Finish(grpc_status.error_code());
          Finish(grpc_status);
        });
  }

  NormalizerService& service_;
  grpc::ByteBuffer* const response_;
  CallTracker tracker_;
  grpc::ByteBuffer raw_request_;
  v1::FitRequest request_;
  v1::FitResponse reply_;
  int64_t steps_ = 0;
  uint64_t durable_after_ = 0;  // Last change to be durable before the reply.
};

}  // namespace

NormalizerService::NormalizerService(Engine& engine, ServerMetrics& metrics,
                                     Admission& admission,
                                     NormalizerServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      admission_(admission),
      options_(std::move(options)),
      watchdog_(options_.stream_idle_timeout) {}

absl::Status NormalizerService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  return CheckBearerToken(context, options_.auth_token);
}

namespace {

// The normd_elements_total label of a Normalize call.
ElementsMode ElementsModeOf(const NormalizeSpec& spec) {
  switch (spec.mode) {
    case NormMode::kBatchNorm:
      return spec.training ? ElementsMode::kBatchNormTrain
                           : ElementsMode::kBatchNormEval;
    case NormMode::kGroupNorm:
      return ElementsMode::kGroupNorm;
    case NormMode::kInstanceNorm:
      return ElementsMode::kInstanceNorm;
    case NormMode::kRmsNorm:
      return ElementsMode::kRmsNorm;
    case NormMode::kL2Norm:
      return ElementsMode::kL2Norm;
    case NormMode::kWeightNorm:
      return ElementsMode::kWeightNorm;
    case NormMode::kLayerNorm:
      break;
  }
  return ElementsMode::kLayerNorm;
}

}  // namespace

absl::Status NormalizerService::CheckReplySize(int64_t bytes,
                                               absl::string_view what) const {
  if (bytes <= options_.max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "response: ", what, " would take about ", bytes,
      " bytes, more than the server sends in one message (--max_message_bytes "
      "= ",
      options_.max_message_bytes, "); refused before anything was changed"));
}

absl::Status NormalizerService::CheckModelReplySize(int64_t channels,
                                                    absl::string_view name,
                                                    int64_t other_bytes) const {
  // A ModelState: six packed arrays of doubles (running_mean / var, mean,
  // var, weight, bias; each a tag and a length of at most 6 bytes), the name
  // and at most 96 bytes of scalars; plus its own tag and length. Counted in
  // double, so that any channel count a shape can claim is sized without
  // overflow; past the int64 range the reply is simply too large.
  const double estimate = 6.0 * (6.0 + 8.0 * static_cast<double>(channels)) +
                          static_cast<double>(name.size()) + 102.0 +
                          static_cast<double>(other_bytes);
  const int64_t bytes = estimate < 9e18 ? static_cast<int64_t>(estimate)
                                        : std::numeric_limits<int64_t>::max();
  return CheckReplySize(bytes, absl::StrCat("the reply with the model of ",
                                            channels, " channels"));
}

void NormalizerService::UpdateModelMetrics() {
  metrics_.SetModels(engine_.store().size(), engine_.store().model_bytes());
}

absl::Status NormalizerService::RunNormalize(
    const v1::NormalizeRequest& request, const ParsedNormalize& parsed,
    void* out, v1::NormalizeResponse& response) {
  if (const std::optional<int64_t> channels =
          Engine::ReturnedModelChannels(parsed.spec)) {
    // The output tensor: data (or 9 bytes per value) and up to 11 bytes per
    // dim; the request_id; tags and lengths.
    const int64_t output_bytes =
        (parsed.input.values_form ? 9 : ElementSize(parsed.input.view.dtype)) *
            parsed.input.view.size +
        11 * static_cast<int64_t>(parsed.input.view.shape.size()) +
        static_cast<int64_t>(request.request_id().size()) + 32;
    if (absl::Status s =
            CheckModelReplySize(*channels, parsed.spec.model, output_bytes);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<std::optional<BatchNormModel>> model =
      engine_.Normalize(parsed.spec, out);
  if (!model.ok()) return model.status();
  response.set_request_id(request.request_id());
  if (model->has_value()) {
    ToModelState(**model, /*with_arrays=*/true, *response.mutable_model());
    if (parsed.spec.training) UpdateModelMetrics();
  }
  metrics_.AddElements(ElementsModeOf(parsed.spec), parsed.input.view.size);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoNormalize(const v1::NormalizeRequest& request,
                                            v1::NormalizeResponse& response) {
  ParsedNormalize parsed;
  if (absl::Status s = ParseNormalizeRequest(request, parsed); !s.ok()) {
    return s;
  }
  return NormalizeToMessage(request, parsed, response);
}

absl::Status NormalizerService::NormalizeToMessage(
    const v1::NormalizeRequest& request, const ParsedNormalize& parsed,
    v1::NormalizeResponse& response) {
  std::vector<double> scratch;
  void* out = PrepareOutput(request.input(), parsed.input, scratch,
                            *response.mutable_output());
  if (absl::Status s = RunNormalize(request, parsed, out, response); !s.ok()) {
    response.Clear();
    return s;
  }
  CopyValuesOutput(parsed.input, scratch, *response.mutable_output());
  return absl::OkStatus();
}

absl::Status NormalizerService::DoNormalizeRaw(const grpc::ByteBuffer& request,
                                               grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  std::vector<absl::string_view> chunks;
  if (absl::Status s = SliceViews(request, slices, chunks); !s.ok()) return s;
  SplitRequest split;
  if (absl::Status s = SplitNormalizeRequest(chunks, split); !s.ok()) return s;
  ParsedNormalize parsed;
  if (absl::Status s = ParseNormalizeRequest(
          split.message, parsed, split.input_data,
          split.scattered.has_value() ? &*split.scattered : nullptr);
      !s.ok()) {
    return s;
  }
  if (!Engine::ReadsScatteredInPlace(parsed.spec)) {
    GatherInput(parsed, split.gathered);  // Into the pool, not a fresh one.
  }
  v1::NormalizeResponse reply;
  if (parsed.input.values_form) {  // The compatibility form: via protobuf.
    if (absl::Status s = NormalizeToMessage(split.message, parsed, reply);
        !s.ok()) {
      return s;
    }
    grpc::Slice slice(reply.SerializeAsString());
    response = grpc::ByteBuffer(&slice, 1);
    return absl::OkStatus();
  }
  return NormalizeFramed(split.message, parsed, MakeResponseFrame, response);
}

absl::Status NormalizerService::NormalizeFramed(
    const v1::NormalizeRequest& request, const ParsedNormalize& parsed,
    FrameFn make_frame, grpc::ByteBuffer& response) {
  v1::NormalizeResponse reply;
  const int64_t bytes =
      parsed.input.view.size * ElementSize(parsed.input.view.dtype);
  v1::Tensor meta;
  SetOutputMeta(request.input(), meta);
  if (bytes <= kSmallOutputBytes) {
    // Small: compute into this thread's scratch, then one slice holding the
    // whole message — one allocation, one copy of a few KiB.
    thread_local std::unique_ptr<double[]> scratch(
        new double[kSmallOutputBytes / sizeof(double)]);
    if (absl::Status s = RunNormalize(request, parsed, scratch.get(), reply);
        !s.ok()) {
      return s;
    }
    const ResponseFrame frame = make_frame(meta, bytes, reply);
    grpc::Slice slice(frame.head.size() + bytes + frame.tail.size());
    char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
    std::memcpy(out, frame.head.data(), frame.head.size());
    std::memcpy(out + frame.head.size(), scratch.get(), bytes);
    std::memcpy(out + frame.head.size() + bytes, frame.tail.data(),
                frame.tail.size());
    response = grpc::ByteBuffer(&slice, 1);
    return absl::OkStatus();
  }
  // Large: computed straight into a pooled, uninitialized buffer that becomes
  // the middle slice of the response (gRPC gives it back to the pool).
  PooledBuffer output = AcquirePooled(bytes);
  if (absl::Status s = RunNormalize(request, parsed, output.get(), reply);
      !s.ok()) {
    return s;
  }
  const ResponseFrame frame = make_frame(meta, bytes, reply);
  grpc::Slice parts[3];
  size_t count = 0;
  parts[count++] = grpc::Slice(frame.head);
  parts[count++] = grpc::Slice(output.release(), static_cast<size_t>(bytes),
                               &BufferPool::Release);
  if (!frame.tail.empty()) parts[count++] = grpc::Slice(frame.tail);
  response = grpc::ByteBuffer(parts, count);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoFit(const v1::FitRequest& request,
                                      v1::FitResponse& response) {
  ParsedFit parsed;
  if (absl::Status s = ParseFitRequest(request, parsed); !s.ok()) return s;
  if (absl::StatusOr<ChannelLayout> layout =
          ResolveChannelAxis(parsed.spec.input.shape, parsed.spec.channel_axis);
      layout.ok()) {
    if (absl::Status s =
            CheckModelReplySize(layout->channels, parsed.spec.model,
                                request.request_id().size() + 16);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<BatchNormModel> model = engine_.Fit(parsed.spec);
  if (!model.ok()) return model.status();
  response.Clear();
  ToModelState(*model, /*with_arrays=*/true, *response.mutable_model());
  response.set_request_id(request.request_id());
  metrics_.AddElements(ElementsMode::kFit, parsed.input.view.size);
  UpdateModelMetrics();
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NormalizerService::Normalize(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunUnary(context, *this, RpcMethod::kNormalize, "Normalize", *request,
                  UnaryOptions{.offload = true}, [this, request, response] {
                    return DoNormalizeRaw(*request, *response);
                  });
}

grpc::ServerUnaryReactor* NormalizerService::Fit(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunParsed<v1::FitRequest, v1::FitResponse>(
      context, *this, RpcMethod::kFit, "Fit", request, response,
      UnaryOptions{.offload = true},
      [this](const v1::FitRequest& parsed, v1::FitResponse& reply) {
        return DoFit(parsed, reply);
      });
}

absl::Status NormalizerService::DoCreateModel(
    const v1::CreateModelRequest& request, v1::ModelState& response) {
  const ModelSpec spec = ToModelSpec(request);
  // A malformed request is INVALID_ARGUMENT before any limit is reported.
  if (absl::Status s = ValidateModelSpec(spec); !s.ok()) return s;
  if (absl::Status s =
          engine_.store().CheckNumFeatures(spec.num_features, "num_features");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckModelReplySize(request.num_features(), request.name(), 0);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = engine_.store().Create(spec);
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  UpdateModelMetrics();
  return absl::OkStatus();
}

absl::Status NormalizerService::DoCreateModels(
    const v1::CreateModelsRequest& request,
    v1::CreateModelsResponse& response) {
  std::vector<ModelSpec> specs;
  specs.reserve(request.models_size());
  for (const v1::CreateModelRequest& model : request.models()) {
    specs.push_back(ToModelSpec(model));
  }
  absl::StatusOr<std::vector<BatchNormModel>> models =
      engine_.store().CreateAll(specs);
  if (!models.ok()) return models.status();
  for (const BatchNormModel& model : *models) {
    ToModelState(model, /*with_arrays=*/false, *response.add_models());
  }
  UpdateModelMetrics();
  return absl::OkStatus();
}

absl::Status NormalizerService::DoGetModel(const v1::GetModelRequest& request,
                                           v1::ModelState& response) {
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = engine_.store().Get(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoListModels(
    const v1::ListModelsRequest& request, v1::ListModelsResponse& response) {
  for (const BatchNormModel& model : engine_.store().List()) {
    ToModelState(model, /*with_arrays=*/false, *response.add_models());
  }
  return absl::OkStatus();
}

absl::Status NormalizerService::DoDeleteModel(
    const v1::DeleteModelRequest& request, v1::DeleteModelResponse& response) {
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  if (absl::Status s = engine_.store().Delete(request.name()); !s.ok()) {
    return s;
  }
  UpdateModelMetrics();
  return absl::OkStatus();
}

absl::Status NormalizerService::DoResetModel(
    const v1::ResetModelRequest& request, v1::ModelState& response) {
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = engine_.store().Reset(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NormalizerService::CreateModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kCreateModel, "CreateModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoCreateModel);
}

grpc::ServerUnaryReactor* NormalizerService::CreateModels(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kCreateModels, "CreateModels",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoCreateModels);
}

grpc::ServerUnaryReactor* NormalizerService::GetModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kGetModel, "GetModel", request,
                   response, UnaryOptions{}, *this,
                   &NormalizerService::DoGetModel);
}

grpc::ServerUnaryReactor* NormalizerService::ListModels(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kListModels, "ListModels",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoListModels);
}

grpc::ServerUnaryReactor* NormalizerService::DeleteModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kDeleteModel, "DeleteModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoDeleteModel);
}

grpc::ServerUnaryReactor* NormalizerService::ResetModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kResetModel, "ResetModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoResetModel);
}

grpc::ServerUnaryReactor* NormalizerService::ExportModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kExportModel, "ExportModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoExportModel);
}

grpc::ServerUnaryReactor* NormalizerService::ImportModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kImportModel, "ImportModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoImportModel);
}

grpc::ServerUnaryReactor* NormalizerService::MergeModel(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(context, *this, RpcMethod::kMergeModel, "MergeModel",
                   request, response, UnaryOptions{}, *this,
                   &NormalizerService::DoMergeModel);
}

absl::Status NormalizerService::DoExportModel(
    const v1::ExportModelRequest& request, v1::ModelState& response) {
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = engine_.store().Get(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  for (const Moments& m : model->pooled) response.add_pooled_m2(m.m2);
  return absl::OkStatus();
}

absl::StatusOr<BatchNormModel> NormalizerService::ParseModelState(
    const v1::ModelState& message, absl::string_view name,
    absl::string_view field) {
  ModelStateSpec state = ToModelStateSpec(message);
  if (!name.empty()) state.config.name = std::string(name);
  if (absl::Status s = ValidateModelState(state, absl::StrCat(field, "."));
      !s.ok()) {
    return s;
  }
  // Before MakeModelFromState fills num_features-sized arrays.
  if (absl::Status s = engine_.store().CheckNumFeatures(
          state.config.num_features, absl::StrCat(field, ".num_features"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckModelReplySize(state.config.num_features, state.config.name, 0);
      !s.ok()) {
    return s;
  }
  return MakeModelFromState(state, absl::StrCat(field, "."));
}

absl::Status NormalizerService::DoImportModel(
    const v1::ImportModelRequest& request, v1::ModelState& response) {
  if (!request.name().empty()) {
    if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<BatchNormModel> model =
      ParseModelState(request.model(), request.name(), "model");
  if (!model.ok()) return model.status();
  model = engine_.store().Put(*std::move(model), request.create_only());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  UpdateModelMetrics();
  return absl::OkStatus();
}

absl::Status NormalizerService::DoMergeModel(
    const v1::MergeModelRequest& request, v1::ModelState& response) {
  if (absl::Status s = ValidateModelName(request.name(), "name"); !s.ok()) {
    return s;
  }
  // The source's own name does not matter: it is validated as the target's.
  absl::StatusOr<BatchNormModel> source =
      ParseModelState(request.source(), request.name(), "source");
  if (!source.ok()) return source.status();
  absl::StatusOr<BatchNormModel> model =
      engine_.store().Merge(request.name(), *source);
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NormalizerService::NormalizeStream(grpc::CallbackServerContext* context) {
  return new NormalizeStreamReactor(*this, *context);
}

grpc::ServerReadReactor<grpc::ByteBuffer>* NormalizerService::FitStream(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new FitStreamReactor(*this, *context, response);
}

}  // namespace normd

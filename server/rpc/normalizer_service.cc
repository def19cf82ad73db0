#include "server/rpc/normalizer_service.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rpc/answering_stream.h"
#include "server/rpc/convert.h"
#include "server/rpc/drift_convert.h"
#include "server/rpc/grpc_call.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/reply_payload.h"
#include "server/service/model_group.h"

namespace normd {
namespace {

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
        stream_(service.front(), Protocol::kGrpc, Method::kNormalizeStream) {
    service_.service().metrics().AddOpenStreams(1);
    if (absl::Status s = stream_.call.Authenticate(AuthorizationOf(context),
                                                   kGrpcTokenCarrier);
        !s.ok()) {
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
    Call& call = stream_.call;
    absl::Status status =
        call.Admit(static_cast<int64_t>(raw_request.Length()));
    uint64_t sequence = 0;
    if (status.ok()) status = ParseMessage(raw_request, request_);
    if (status.ok()) {
      Call::Deferred result = Call::RunDeferred(
          [&] { return service_.DoNormalize(request_, response_); });
      status = result.status;
      sequence = result.sequence;
    }
    call.ReleaseAdmission();  // Only the write is left.
    // A training step is answered once it is durable (from the log's
    // thread; at once otherwise).
    call.WhenDurable(
        status.ok() ? sequence : 0, [this, status](absl::Status durable) {
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
    service_.service().metrics().IdleStreamEnded();
    return absl::Status(status.code(), absl::StrCat(status.message(), " after ",
                                                    messages_, " messages"));
  }
  void OnFinishing(const absl::Status& status) override {
    stream_.Record(status);
  }
  void OnClosed() override { service_.service().metrics().AddOpenStreams(-1); }

  NormalizerService& service_;
  GrpcCall stream_;
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
        stream_(service.front(), Protocol::kGrpc, Method::kFitStream) {
    service_.service().metrics().AddOpenStreams(1);
    service_.watchdog().Add(this);
    if (absl::Status s = stream_.call.Authenticate(AuthorizationOf(context),
                                                   kGrpcTokenCarrier);
        !s.ok()) {
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
    Call& call = stream_.call;
    absl::Status status =
        call.Admit(static_cast<int64_t>(raw_request_.Length()));
    if (status.ok()) status = ParseMessage(raw_request_, request_);
    if (status.ok()) {
      Call::Deferred result =
          Call::RunDeferred([&] { return service_.DoFit(request_, reply_); });
      status = result.status;
      durable_after_ = std::max(durable_after_, result.sequence);
    }
    call.ReleaseAdmission();
    if (!status.ok()) {
      FinishOnce(absl::Status(
          status.code(),
          absl::StrCat("FitStream message ", steps_, ": ", status.message(),
                       "; the ", steps_, " steps before it are applied")));
      return;
    }
    ++steps_;
    ReadNext();
  }

  void OnDone() override {
    service_.watchdog().Remove(this);
    service_.service().metrics().AddOpenStreams(-1);
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
    service_.service().metrics().IdleStreamEnded();
    FinishWith(absl::Status(status.code(),
                            absl::StrCat(status.message(), "; the ", steps_,
                                         " steps it carried are applied")));
  }
  // Finishes once the steps applied so far are durable.
  void FinishWith(const absl::Status& status) {
    stream_.call.WhenDurable(
        durable_after_, [this, status](absl::Status durable) {
          const absl::Status final_status = durable.ok() ? status : durable;
          stream_.Record(final_status);
          Finish(ToGrpcStatus(final_status));
        });
  }

  NormalizerService& service_;
  grpc::ByteBuffer* const response_;
  GrpcCall stream_;
  grpc::ByteBuffer raw_request_;
  v1::FitRequest request_;
  v1::FitResponse reply_;
  int64_t steps_ = 0;
  uint64_t durable_after_ = 0;  // Last change to be durable before the reply.
};

}  // namespace

NormalizerService::NormalizerService(GrpcFrontEnd front,
                                     NormalizerServiceOptions options)
    : front_(front), watchdog_(options.stream_idle_timeout) {}

absl::Status NormalizerService::RunNormalize(
    const v1::NormalizeRequest& request, const ParsedNormalize& parsed,
    void* out, v1::NormalizeResponse& response) {
  // The output tensor: data (or 9 bytes per value) and up to 11 bytes per
  // dim; the request_id; tags and lengths.
  const ReplySize reply{
      .bytes =
          (parsed.input.values_form ? 9
                                    : ElementSize(parsed.input.view.dtype)) *
              parsed.input.view.size +
          11 * static_cast<int64_t>(parsed.input.view.shape.size()) +
          static_cast<int64_t>(request.request_id().size()) + 32,
      .with_model_arrays = true};
  absl::StatusOr<std::optional<BatchNormModel>> model =
      service().Normalize(parsed.spec, out, reply);
  if (!model.ok()) return model.status();
  response.set_request_id(request.request_id());
  if (model->has_value()) {
    ToModelState(**model, /*with_arrays=*/true, *response.mutable_model());
  }
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
  const int64_t bytes =
      parsed.input.view.size * ElementSize(parsed.input.view.dtype);
  ReplyPayload payload(bytes);
  if (absl::Status s =
          RunNormalize(split.message, parsed, payload.data(), reply);
      !s.ok()) {
    return s;
  }
  v1::Tensor meta;
  SetOutputMeta(split.message.input(), meta);
  const ResponseFrame frame = MakeResponseFrame(meta, bytes, reply);
  response = payload.Assemble(frame.head, frame.tail);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoFit(const v1::FitRequest& request,
                                      v1::FitResponse& response) {
  ParsedFit parsed;
  if (absl::Status s = ParseFitRequest(request, parsed); !s.ok()) return s;
  absl::StatusOr<BatchNormModel> model = service().Fit(
      parsed.spec,
      ReplySize{.bytes = static_cast<int64_t>(request.request_id().size()) + 16,
                .with_model_arrays = true});
  if (!model.ok()) return model.status();
  response.Clear();
  ToModelState(*model, /*with_arrays=*/true, *response.mutable_model());
  response.set_request_id(request.request_id());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NormalizerService::Normalize(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunUnary(front_, Protocol::kGrpc, Method::kNormalize, context,
                  *request, UnaryOptions{.offload = true},
                  [this, request, response] {
                    return DoNormalizeRaw(*request, *response);
                  });
}

grpc::ServerUnaryReactor* NormalizerService::Fit(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunMember(front_, Protocol::kGrpc, Method::kFit, context, request,
                   response, UnaryOptions{.offload = true}, *this,
                   &NormalizerService::DoFit);
}

absl::Status NormalizerService::DoCreateModel(
    const v1::CreateModelRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model =
      service().CreateModel(ToModelSpec(request));
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoCreateModels(
    const v1::CreateModelsRequest& request, v1::CreateModelsResponse& response,
    const std::optional<std::string>& routed_group) {
  std::vector<ModelSpec> specs;
  specs.reserve(request.models_size());
  for (const v1::CreateModelRequest& model : request.models()) {
    specs.push_back(ToModelSpec(model));
  }
  absl::StatusOr<std::vector<BatchNormModel>> models =
      service().CreateModels(specs, routed_group);
  if (!models.ok()) return models.status();
  for (const BatchNormModel& model : *models) {
    ToModelState(model, /*with_arrays=*/false, *response.add_models());
  }
  return absl::OkStatus();
}

absl::Status NormalizerService::DoGetModel(const v1::GetModelRequest& request,
                                           v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model = service().GetModel(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  WithReferenceArrays(*model, response);
  if (std::optional<DriftReport> drift = service().Drift(*model)) {
    ToDriftReportMessage(*drift, /*with_arrays=*/true,
                         *response.mutable_drift());
  }
  return absl::OkStatus();
}

absl::Status NormalizerService::DoListModels(
    const v1::ListModelsRequest& request, v1::ListModelsResponse& response) {
  absl::StatusOr<std::vector<BatchNormModel>> models =
      service().ListModels(request.group());
  if (!models.ok()) return models.status();
  for (const BatchNormModel& model : *models) {
    v1::ModelState& state = *response.add_models();
    ToModelState(model, /*with_arrays=*/false, state);
    if (std::optional<DriftReport> drift = service().Drift(model)) {
      ToDriftReportMessage(*drift, /*with_arrays=*/false,
                           *state.mutable_drift());
    }
  }
  return absl::OkStatus();
}

absl::Status NormalizerService::DoDeleteModel(
    const v1::DeleteModelRequest& request, v1::DeleteModelResponse& response) {
  return service().DeleteModel(request.name());
}

absl::Status NormalizerService::DoResetModel(
    const v1::ResetModelRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model = service().ResetModel(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoExportModel(
    const v1::ExportModelRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model = service().GetModel(request.name());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  WithReferenceArrays(*model, response);
  for (const Moments& m : model->pooled) response.add_pooled_m2(m.m2);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoImportModel(
    const v1::ImportModelRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model = service().ImportModel(
      ToModelStateSpec(request.model()), request.name(), request.create_only());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoMergeModel(
    const v1::MergeModelRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model =
      service().MergeModel(request.name(), ToModelStateSpec(request.source()));
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoSetReference(
    const v1::SetReferenceRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model =
      service().SetReference(request.model(), ToReferenceRequest(request));
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  WithReferenceArrays(*model, response);
  return absl::OkStatus();
}

absl::Status NormalizerService::DoClearReference(
    const v1::ClearReferenceRequest& request, v1::ModelState& response) {
  absl::StatusOr<BatchNormModel> model =
      service().ClearReference(request.model());
  if (!model.ok()) return model.status();
  ToModelState(*model, /*with_arrays=*/true, response);
  return absl::OkStatus();
}

#define NORMD_MODEL_METHOD(name)                                             \
  grpc::ServerUnaryReactor* NormalizerService::name(                         \
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request, \
      grpc::ByteBuffer* response) {                                          \
    return RunMember(front_, Protocol::kGrpc, Method::k##name, context,      \
                     request, response, UnaryOptions{}, *this,               \
                     &NormalizerService::Do##name);                          \
  }
NORMD_MODEL_METHOD(CreateModel)
NORMD_MODEL_METHOD(GetModel)
NORMD_MODEL_METHOD(ListModels)
NORMD_MODEL_METHOD(DeleteModel)
NORMD_MODEL_METHOD(ResetModel)
NORMD_MODEL_METHOD(ExportModel)
NORMD_MODEL_METHOD(ImportModel)
NORMD_MODEL_METHOD(MergeModel)
NORMD_MODEL_METHOD(SetReference)
NORMD_MODEL_METHOD(ClearReference)
#undef NORMD_MODEL_METHOD

grpc::ServerUnaryReactor* NormalizerService::CreateModels(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunParsed<v1::CreateModelsRequest, v1::CreateModelsResponse>(
      front_, Protocol::kGrpc, Method::kCreateModels, context, request,
      response, UnaryOptions{},
      [this, routed_group = MetadataValue(*context, kRoutingGroupHeader)](
          const v1::CreateModelsRequest& parsed,
          v1::CreateModelsResponse& reply) {
        return DoCreateModels(parsed, reply, routed_group);
      });
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

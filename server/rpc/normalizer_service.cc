#include "server/rpc/normalizer_service.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/parallel.h"
#include "server/rpc/convert.h"
#include "server/rpc/logging.h"
#include "server/rpc/status_mapping.h"

namespace normd {
namespace {

// Outputs up to this size are sent as one slice with the response's other
// fields (a copy is cheaper than the extra allocations); larger ones are
// computed in place into their own slice.
constexpr int64_t kSmallOutputBytes = 64 << 10;

// Runs a handler body, turning an allocation failure into RESOURCE_EXHAUSTED
// so that no exception crosses into gRPC.
template <typename Fn>
absl::Status Guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "the server could not allocate memory for this request");
  }
}

// Logs server-side faults (not client errors, which are per request).
void LogIfServerFault(const char* method, const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
      Log(LogSeverity::kError,
          absl::StrCat(method, " failed: ", status.error_message()));
      break;
    default:
      break;
  }
}

// Finishes a unary call with `status`, logged and counted.
void FinishUnary(grpc::ServerUnaryReactor* reactor, CallTracker& tracker,
                 const char* name, const absl::Status& status) {
  const grpc::Status grpc_status = ToGrpcStatus(status);
  LogIfServerFault(name, grpc_status);
  tracker.Finish(grpc_status.error_code());
  reactor->Finish(grpc_status);
}

// What a unary call holds from admission to its reply.
struct UnaryCall {
  UnaryCall(NormalizerService& service, RpcMethod method,
            grpc::CallbackServerContext* call_context, const char* method_name)
      : tracker(service.metrics(), method),
        reactor(call_context->DefaultReactor()),
        context(call_context),
        name(method_name) {}
  CallTracker tracker;
  grpc::ServerUnaryReactor* const reactor;
  grpc::CallbackServerContext* const context;
  const char* const name;
  Admission::Ticket ticket;
};

// Runs `body` and finishes the call with its status. A call whose client
// has gone (cancelled, or past its deadline) is not run. A body that changed
// models finishes only once its changes are durable (with --state_dir): it
// runs in a DeferDurability scope, and the log's thread finishes the call,
// so that no gRPC thread blocks on a disk sync.
template <typename Fn>
void CompleteUnary(std::shared_ptr<UnaryCall> call, ModelStore& store,
                   const Fn& body) {
  if (call->context->IsCancelled()) {
    FinishUnary(call->reactor, call->tracker, call->name,
                absl::CancelledError("the call was cancelled or its deadline "
                                     "passed before it ran"));
    return;
  }
  absl::Status status;
  uint64_t sequence = 0;
  {
    DeferDurability defer;
    status = Guarded(body);
    sequence = defer.sequence();
  }
  if (!status.ok() || sequence == 0) {
    FinishUnary(call->reactor, call->tracker, call->name, status);
    return;
  }
  store.OnDurable(sequence, [call](const absl::Status& durable) {
    FinishUnary(call->reactor, call->tracker, call->name, durable);
  });
}

// Admits an authenticated call of `request_bytes`, or refuses it with
// UNAUTHENTICATED or RESOURCE_EXHAUSTED and finishes it (false).
bool AdmitUnary(NormalizerService& service, UnaryCall& call,
                int64_t request_bytes) {
  if (absl::Status s = service.Authenticate(*call.context); !s.ok()) {
    FinishUnary(call.reactor, call.tracker, call.name, s);
    return false;
  }
  absl::StatusOr<Admission::Ticket> ticket =
      service.admission().Admit(1, request_bytes);
  if (!ticket.ok()) {
    service.metrics().Rejected();
    FinishUnary(call.reactor, call.tracker, call.name, ticket.status());
    return false;
  }
  call.ticket = std::move(*ticket);
  return true;
}

// Completes a unary call: admits it, runs `body`, records the metrics,
// finishes.
template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context,
                                   NormalizerService& service, RpcMethod method,
                                   const char* name, int64_t request_bytes,
                                   Fn&& body) {
  auto call = std::make_shared<UnaryCall>(service, method, context, name);
  grpc::ServerUnaryReactor* reactor = call->reactor;
  if (AdmitUnary(service, *call, request_bytes)) {
    CompleteUnary(std::move(call), service.store(), body);
  }
  return reactor;
}

// Requests at least this large are computed in the compute arena rather than
// on the gRPC callback thread that received them, so that one big tensor
// never holds up the threads serving everyone else; smaller ones are cheaper
// to compute in place than to hand over.
constexpr size_t kOffloadRequestBytes = 256 << 10;

// RunUnary for compute RPCs: requests of kOffloadRequestBytes or more run
// `body` (which must own or point to everything it uses) in the compute
// arena and finish the call from there.
template <typename Fn>
grpc::ServerUnaryReactor* RunCompute(grpc::CallbackServerContext* context,
                                     NormalizerService& service,
                                     RpcMethod method, const char* name,
                                     int64_t request_bytes, Fn body) {
  if (request_bytes < static_cast<int64_t>(kOffloadRequestBytes)) {
    return RunUnary(context, service, method, name, request_bytes, body);
  }
  auto call = std::make_shared<UnaryCall>(service, method, context, name);
  grpc::ServerUnaryReactor* reactor = call->reactor;
  if (!AdmitUnary(service, *call, request_bytes)) return reactor;
  EnqueueCompute([call = std::move(call), &service, body = std::move(body)] {
    CompleteUnary(call, service.store(), body);
  });
  return reactor;
}

// NormalizeStream: read a request, answer it, read the next; responses go
// out in request order. A failed request fills that response's `error`.
class NormalizeStreamReactor final
    : public grpc::ServerBidiReactor<v1::NormalizeRequest,
                                     v1::NormalizeResponse> {
 public:
  NormalizeStreamReactor(NormalizerService& service,
                         const grpc::CallbackServerContext& context)
      : service_(service),
        tracker_(service.metrics(), RpcMethod::kNormalizeStream) {
    if (absl::Status s = service.Authenticate(context); !s.ok()) {
      FinishWith(ToGrpcStatus(s));
      return;
    }
    absl::StatusOr<Admission::Ticket> ticket = service.admission().Admit(1, 0);
    if (!ticket.ok()) {
      service.metrics().Rejected();
      FinishWith(ToGrpcStatus(ticket.status()));
      return;
    }
    ticket_ = std::move(*ticket);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishWith(grpc::Status::OK);
      return;
    }
    response_.Clear();
    absl::StatusOr<Admission::Ticket> message_ticket =
        service_.admission().Admit(
            0, static_cast<int64_t>(request_.ByteSizeLong()));
    if (!message_ticket.ok()) service_.metrics().Rejected();
    absl::Status status = message_ticket.status();
    uint64_t sequence = 0;
    if (message_ticket.ok()) {
      DeferDurability defer;
      status =
          Guarded([&] { return service_.DoNormalize(request_, response_); });
      sequence = defer.sequence();
    }
    // A training step is answered once it is durable (from the log's
    // thread; at once otherwise).
    service_.store().OnDurable(
        status.ok() ? sequence : 0,
        [this, status](const absl::Status& durable) {
          const absl::Status final_status = durable.ok() ? status : durable;
          if (!final_status.ok()) {
            response_.Clear();
            response_.set_request_id(request_.request_id());
            response_.mutable_error()->set_code(
                static_cast<int>(final_status.code()));
            response_.mutable_error()->set_message(
                std::string(final_status.message()));
          }
          StartWrite(&response_);
        });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishWith(grpc::Status(grpc::StatusCode::CANCELLED,
                              "the client stopped reading"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  void FinishWith(const grpc::Status& status) {
    tracker_.Finish(status.error_code());
    Finish(status);
  }

  NormalizerService& service_;
  CallTracker tracker_;
  Admission::Ticket ticket_;
  v1::NormalizeRequest request_;
  v1::NormalizeResponse response_;
};

// FitStream: each message is one Fit step, applied as it arrives. The reply
// (the model after the last step) is sent when the client half-closes, once
// every step is durable; a failing message ends the call with its error
// (also once the steps before it are durable).
class FitStreamReactor final : public grpc::ServerReadReactor<v1::FitRequest> {
 public:
  FitStreamReactor(NormalizerService& service,
                   const grpc::CallbackServerContext& context,
                   v1::FitResponse* response)
      : service_(service),
        response_(response),
        tracker_(service.metrics(), RpcMethod::kFitStream) {
    if (absl::Status s = service.Authenticate(context); !s.ok()) {
      FinishWith(s);
      return;
    }
    absl::StatusOr<Admission::Ticket> ticket = service.admission().Admit(1, 0);
    if (!ticket.ok()) {
      service.metrics().Rejected();
      FinishWith(ticket.status());
      return;
    }
    ticket_ = std::move(*ticket);
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishWith(steps_ > 0 ? absl::OkStatus()
                            : absl::InvalidArgumentError(
                                  "FitStream: the stream carried no "
                                  "FitRequest"));
      return;
    }
    absl::Status status;
    absl::StatusOr<Admission::Ticket> message_ticket =
        service_.admission().Admit(
            0, static_cast<int64_t>(request_.ByteSizeLong()));
    if (!message_ticket.ok()) {
      service_.metrics().Rejected();
      status = message_ticket.status();
    } else {
      DeferDurability defer;
      status = Guarded([&] { return service_.DoFit(request_, *response_); });
      durable_after_ = std::max(durable_after_, defer.sequence());
    }
    if (!status.ok()) {
      FinishWith(absl::Status(
          status.code(),
          absl::StrCat("FitStream message ", steps_, ": ", status.message())));
      return;
    }
    ++steps_;
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
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
  v1::FitResponse* response_;
  CallTracker tracker_;
  Admission::Ticket ticket_;
  v1::FitRequest request_;
  int64_t steps_ = 0;
  uint64_t durable_after_ = 0;  // Last change to be durable before the reply.
};

}  // namespace

NormalizerService::NormalizerService(Engine& engine, ServerMetrics& metrics,
                                     Admission& admission,
                                     std::string auth_token)
    : engine_(engine),
      metrics_(metrics),
      admission_(admission),
      auth_token_(std::move(auth_token)) {}

absl::Status NormalizerService::Authenticate(
    const grpc::CallbackServerContext& context) const {
  if (auth_token_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  const std::string expected = "Bearer " + auth_token_;
  if (it != metadata.end() && it->second.size() == expected.size()) {
    // Constant time: the comparison does not reveal how much matched.
    unsigned char differ = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      differ |= static_cast<unsigned char>(it->second.data()[i] ^ expected[i]);
    }
    if (differ == 0) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "authorization: this server needs the metadata \"authorization: Bearer "
      "<token>\" with its token (--auth_token_file); it was missing or wrong");
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
    case NormMode::kLayerNorm:
      break;
  }
  return ElementsMode::kLayerNorm;
}

}  // namespace

absl::Status NormalizerService::RunNormalize(
    const v1::NormalizeRequest& request, const ParsedNormalize& parsed,
    void* out, v1::NormalizeResponse& response) {
  absl::StatusOr<std::optional<BatchNormModel>> model =
      engine_.Normalize(parsed.spec, out);
  if (!model.ok()) return model.status();
  response.set_request_id(request.request_id());
  if (model->has_value()) {
    ToModelState(**model, /*with_arrays=*/true, *response.mutable_model());
    if (parsed.spec.training) metrics_.SetModels(engine_.store().size());
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
  if (!request.Dump(&slices).ok()) {
    return absl::InternalError("request: cannot read the message bytes");
  }
  std::vector<absl::string_view> chunks;
  chunks.reserve(slices.size());
  for (const grpc::Slice& slice : slices) {
    chunks.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                        slice.size());
  }
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
    GatherInput(split, parsed);  // Into the pool, not a fresh buffer.
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
  v1::Tensor meta;
  SetOutputMeta(split.message.input(), meta);
  if (bytes <= kSmallOutputBytes) {
    // Small: compute into this thread's scratch, then one slice holding the
    // whole message — one allocation, one copy of a few KiB.
    thread_local std::unique_ptr<double[]> scratch(
        new double[kSmallOutputBytes / sizeof(double)]);
    if (absl::Status s =
            RunNormalize(split.message, parsed, scratch.get(), reply);
        !s.ok()) {
      return s;
    }
    const ResponseFrame frame = MakeResponseFrame(meta, bytes, reply);
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
  if (absl::Status s = RunNormalize(split.message, parsed, output.get(), reply);
      !s.ok()) {
    return s;
  }
  const ResponseFrame frame = MakeResponseFrame(meta, bytes, reply);
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
  absl::StatusOr<BatchNormModel> model = engine_.Fit(parsed.spec);
  if (!model.ok()) return model.status();
  response.Clear();
  ToModelState(*model, /*with_arrays=*/true, *response.mutable_model());
  response.set_request_id(request.request_id());
  metrics_.AddElements(ElementsMode::kFit, parsed.input.view.size);
  metrics_.SetModels(engine_.store().size());
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NormalizerService::Normalize(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return RunCompute(context, *this, RpcMethod::kNormalize, "Normalize",
                    static_cast<int64_t>(request->Length()),
                    [this, request, response] {
                      return DoNormalizeRaw(*request, *response);
                    });
}

grpc::ServerUnaryReactor* NormalizerService::Fit(
    grpc::CallbackServerContext* context, const v1::FitRequest* request,
    v1::FitResponse* response) {
  return RunCompute(
      context, *this, RpcMethod::kFit, "Fit",
      static_cast<int64_t>(request->ByteSizeLong()),
      [this, request, response] { return DoFit(*request, *response); });
}

grpc::ServerUnaryReactor* NormalizerService::CreateModel(
    grpc::CallbackServerContext* context, const v1::CreateModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(context, *this, RpcMethod::kCreateModel, "CreateModel",
                  request->ByteSizeLong(), [&] {
                    absl::StatusOr<BatchNormModel> model =
                        engine_.store().Create(ToModelSpec(*request));
                    if (!model.ok()) return model.status();
                    ToModelState(*model, /*with_arrays=*/true, *response);
                    metrics_.SetModels(engine_.store().size());
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* NormalizerService::GetModel(
    grpc::CallbackServerContext* context, const v1::GetModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(
      context, *this, RpcMethod::kGetModel, "GetModel", request->ByteSizeLong(),
      [&] {
        if (absl::Status s = ValidateModelName(request->name(), "name");
            !s.ok()) {
          return s;
        }
        absl::StatusOr<BatchNormModel> model =
            engine_.store().Get(request->name());
        if (!model.ok()) return model.status();
        ToModelState(*model, /*with_arrays=*/true, *response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* NormalizerService::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest* request,
    v1::ListModelsResponse* response) {
  return RunUnary(context, *this, RpcMethod::kListModels, "ListModels",
                  request->ByteSizeLong(), [&] {
                    for (const BatchNormModel& model : engine_.store().List()) {
                      ToModelState(model, /*with_arrays=*/false,
                                   *response->add_models());
                    }
                    return absl::OkStatus();
                  });
}

grpc::ServerUnaryReactor* NormalizerService::DeleteModel(
    grpc::CallbackServerContext* context, const v1::DeleteModelRequest* request,
    v1::DeleteModelResponse* response) {
  return RunUnary(
      context, *this, RpcMethod::kDeleteModel, "DeleteModel",
      request->ByteSizeLong(), [&] {
        if (absl::Status s = ValidateModelName(request->name(), "name");
            !s.ok()) {
          return s;
        }
        if (absl::Status s = engine_.store().Delete(request->name()); !s.ok()) {
          return s;
        }
        metrics_.SetModels(engine_.store().size());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* NormalizerService::ResetModel(
    grpc::CallbackServerContext* context, const v1::ResetModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(
      context, *this, RpcMethod::kResetModel, "ResetModel",
      request->ByteSizeLong(), [&] {
        if (absl::Status s = ValidateModelName(request->name(), "name");
            !s.ok()) {
          return s;
        }
        absl::StatusOr<BatchNormModel> model =
            engine_.store().Reset(request->name());
        if (!model.ok()) return model.status();
        ToModelState(*model, /*with_arrays=*/true, *response);
        return absl::OkStatus();
      });
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
  metrics_.SetModels(engine_.store().size());
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

grpc::ServerUnaryReactor* NormalizerService::ExportModel(
    grpc::CallbackServerContext* context, const v1::ExportModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(context, *this, RpcMethod::kExportModel, "ExportModel",
                  request->ByteSizeLong(), [this, request, response] {
                    return DoExportModel(*request, *response);
                  });
}

grpc::ServerUnaryReactor* NormalizerService::ImportModel(
    grpc::CallbackServerContext* context, const v1::ImportModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(context, *this, RpcMethod::kImportModel, "ImportModel",
                  request->ByteSizeLong(), [this, request, response] {
                    return DoImportModel(*request, *response);
                  });
}

grpc::ServerUnaryReactor* NormalizerService::MergeModel(
    grpc::CallbackServerContext* context, const v1::MergeModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(context, *this, RpcMethod::kMergeModel, "MergeModel",
                  request->ByteSizeLong(), [this, request, response] {
                    return DoMergeModel(*request, *response);
                  });
}

grpc::ServerBidiReactor<v1::NormalizeRequest, v1::NormalizeResponse>*
NormalizerService::NormalizeStream(grpc::CallbackServerContext* context) {
  return new NormalizeStreamReactor(*this, *context);
}

grpc::ServerReadReactor<v1::FitRequest>* NormalizerService::FitStream(
    grpc::CallbackServerContext* context, v1::FitResponse* response) {
  return new FitStreamReactor(*this, *context, response);
}

}  // namespace normd

#include "server/rpc/normalizer_service.h"

#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/rpc/logging.h"
#include "server/rpc/status_mapping.h"

namespace normd {
namespace {

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

// Completes a unary call: runs `body`, records the metrics, finishes.
template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context,
                                   ServerMetrics& metrics, RpcMethod method,
                                   const char* name, Fn&& body) {
  CallTracker tracker(metrics, method);
  const grpc::Status status = ToGrpcStatus(Guarded(body));
  LogIfServerFault(name, status);
  tracker.Finish(status.error_code());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// NormalizeStream: read a request, answer it, read the next; responses go
// out in request order. A failed request fills that response's `error`.
class NormalizeStreamReactor final
    : public grpc::ServerBidiReactor<v1::NormalizeRequest,
                                     v1::NormalizeResponse> {
 public:
  explicit NormalizeStreamReactor(NormalizerService& service)
      : service_(service),
        tracker_(service.metrics(), RpcMethod::kNormalizeStream) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishWith(grpc::Status::OK);
      return;
    }
    response_.Clear();
    const absl::Status status =
        Guarded([&] { return service_.DoNormalize(request_, response_); });
    if (!status.ok()) {
      response_.Clear();
      response_.set_request_id(request_.request_id());
      response_.mutable_error()->set_code(static_cast<int>(status.code()));
      response_.mutable_error()->set_message(std::string(status.message()));
    }
    StartWrite(&response_);
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
  v1::NormalizeRequest request_;
  v1::NormalizeResponse response_;
};

// FitStream: each message is one Fit step, applied as it arrives. The reply
// (the model after the last step) is sent when the client half-closes; a
// failing message ends the call with its error.
class FitStreamReactor final : public grpc::ServerReadReactor<v1::FitRequest> {
 public:
  FitStreamReactor(NormalizerService& service, v1::FitResponse* response)
      : service_(service),
        response_(response),
        tracker_(service.metrics(), RpcMethod::kFitStream) {
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
    const absl::Status status =
        Guarded([&] { return service_.DoFit(request_, *response_); });
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
    const grpc::Status grpc_status = ToGrpcStatus(status);
    LogIfServerFault("FitStream", grpc_status);
    tracker_.Finish(grpc_status.error_code());
    Finish(grpc_status);
  }

  NormalizerService& service_;
  v1::FitResponse* response_;
  CallTracker tracker_;
  v1::FitRequest request_;
  int64_t steps_ = 0;
};

}  // namespace

NormalizerService::NormalizerService(Engine& engine, ServerMetrics& metrics)
    : engine_(engine), metrics_(metrics) {}

absl::Status NormalizerService::DoNormalize(const v1::NormalizeRequest& request,
                                            v1::NormalizeResponse& response) {
  ParsedNormalize parsed;
  if (absl::Status s = ParseNormalizeRequest(request, parsed); !s.ok()) {
    return s;
  }
  std::vector<double> scratch;
  v1::Tensor& output = *response.mutable_output();
  void* out = PrepareOutput(request.input(), parsed.input, scratch, output);
  absl::StatusOr<std::optional<BatchNormModel>> model =
      engine_.Normalize(parsed.spec, out);
  if (!model.ok()) {
    response.clear_output();
    return model.status();
  }
  CopyValuesOutput(parsed.input, scratch, output);
  response.set_request_id(request.request_id());
  ElementsMode mode = ElementsMode::kLayerNorm;
  if (model->has_value()) {
    ToModelState(**model, /*with_arrays=*/true, *response.mutable_model());
    mode = parsed.spec.training ? ElementsMode::kBatchNormTrain
                                : ElementsMode::kBatchNormEval;
    if (parsed.spec.training) metrics_.SetModels(engine_.store().size());
  }
  metrics_.AddElements(mode, parsed.input.view.size);
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
    grpc::CallbackServerContext* context, const v1::NormalizeRequest* request,
    v1::NormalizeResponse* response) {
  return RunUnary(context, metrics_, RpcMethod::kNormalize, "Normalize",
                  [&] { return DoNormalize(*request, *response); });
}

grpc::ServerUnaryReactor* NormalizerService::Fit(
    grpc::CallbackServerContext* context, const v1::FitRequest* request,
    v1::FitResponse* response) {
  return RunUnary(context, metrics_, RpcMethod::kFit, "Fit",
                  [&] { return DoFit(*request, *response); });
}

grpc::ServerUnaryReactor* NormalizerService::CreateModel(
    grpc::CallbackServerContext* context, const v1::CreateModelRequest* request,
    v1::ModelState* response) {
  return RunUnary(context, metrics_, RpcMethod::kCreateModel, "CreateModel",
                  [&] {
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
  return RunUnary(context, metrics_, RpcMethod::kGetModel, "GetModel", [&] {
    if (absl::Status s = ValidateModelName(request->name(), "name"); !s.ok()) {
      return s;
    }
    absl::StatusOr<BatchNormModel> model = engine_.store().Get(request->name());
    if (!model.ok()) return model.status();
    ToModelState(*model, /*with_arrays=*/true, *response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* NormalizerService::ListModels(
    grpc::CallbackServerContext* context, const v1::ListModelsRequest* request,
    v1::ListModelsResponse* response) {
  return RunUnary(context, metrics_, RpcMethod::kListModels, "ListModels", [&] {
    for (const BatchNormModel& model : engine_.store().List()) {
      ToModelState(model, /*with_arrays=*/false, *response->add_models());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* NormalizerService::DeleteModel(
    grpc::CallbackServerContext* context, const v1::DeleteModelRequest* request,
    v1::DeleteModelResponse* response) {
  return RunUnary(
      context, metrics_, RpcMethod::kDeleteModel, "DeleteModel", [&] {
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
  return RunUnary(context, metrics_, RpcMethod::kResetModel, "ResetModel", [&] {
    if (absl::Status s = ValidateModelName(request->name(), "name"); !s.ok()) {
      return s;
    }
    absl::StatusOr<BatchNormModel> model =
        engine_.store().Reset(request->name());
    if (!model.ok()) return model.status();
    ToModelState(*model, /*with_arrays=*/true, *response);
    return absl::OkStatus();
  });
}

grpc::ServerBidiReactor<v1::NormalizeRequest, v1::NormalizeResponse>*
NormalizerService::NormalizeStream(grpc::CallbackServerContext* context) {
  return new NormalizeStreamReactor(*this);
}

grpc::ServerReadReactor<v1::FitRequest>* NormalizerService::FitStream(
    grpc::CallbackServerContext* context, v1::FitResponse* response) {
  return new FitStreamReactor(*this, response);
}

}  // namespace normd

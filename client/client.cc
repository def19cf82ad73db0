#include "client/client.h"

#include <utility>

namespace normd::client {
namespace {

// The server's error as the client's: grpc::StatusCode and absl::StatusCode
// share google.rpc.Code's numbering.
absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Runs a unary stub call and returns its response or mapped status.
template <typename Response, typename Call>
absl::StatusOr<Response> Unary(Call&& call) {
  Response response;
  grpc::Status status = call(&response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

}  // namespace

std::unique_ptr<NormdClient> NormdClient::Connect(const std::string& target,
                                                  ClientOptions options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  return std::make_unique<NormdClient>(
      grpc::CreateCustomChannel(target,
                                options.credentials != nullptr
                                    ? options.credentials
                                    : grpc::InsecureChannelCredentials(),
                                args),
      options);
}

NormdClient::NormdClient(std::shared_ptr<grpc::Channel> channel,
                         ClientOptions options)
    : options_(options),
      channel_(std::move(channel)),
      stub_(v1::Normalizer::NewStub(channel_)),
      health_(grpc::health::v1::Health::NewStub(channel_)) {}

void NormdClient::Prepare(grpc::ClientContext& context,
                          absl::string_view model) const {
  PrepareGroup(context, ModelGroupOf(model));
  if (!model.empty()) context.AddMetadata(kModelHeader, std::string(model));
}

void NormdClient::PrepareGroup(grpc::ClientContext& context,
                               absl::string_view group) const {
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.timeout));
  if (!group.empty()) context.AddMetadata(kGroupHeader, std::string(group));
  if (!options_.bearer_token.empty()) {
    context.AddMetadata("authorization", "Bearer " + options_.bearer_token);
  }
}

absl::StatusOr<v1::NormalizeResponse> NormdClient::Normalize(
    const v1::NormalizeRequest& request) {
  return Unary<v1::NormalizeResponse>([&](v1::NormalizeResponse* response) {
    grpc::ClientContext context;
    Prepare(context, request.mode() == v1::LAYER_NORM ? "" : request.model());
    return stub_->Normalize(&context, request, response);
  });
}

absl::StatusOr<v1::FitResponse> NormdClient::Fit(
    const v1::FitRequest& request) {
  return Unary<v1::FitResponse>([&](v1::FitResponse* response) {
    grpc::ClientContext context;
    Prepare(context, request.model());
    return stub_->Fit(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::CreateModel(
    const v1::CreateModelRequest& request) {
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, request.name());
    return stub_->CreateModel(&context, request, response);
  });
}

absl::StatusOr<v1::CreateModelsResponse> NormdClient::CreateModels(
    const v1::CreateModelsRequest& request) {
  return Unary<v1::CreateModelsResponse>(
      [&](v1::CreateModelsResponse* response) {
        grpc::ClientContext context;
        // The group every name shares, or none (a proxy refuses the call).
        absl::string_view group = request.models().empty()
                                      ? ""
                                      : ModelGroupOf(request.models(0).name());
        for (const v1::CreateModelRequest& model : request.models()) {
          if (ModelGroupOf(model.name()) != group) {
            group = "";
            break;
          }
        }
        PrepareGroup(context, group);
        return stub_->CreateModels(&context, request, response);
      });
}

absl::StatusOr<v1::ModelState> NormdClient::GetModel(absl::string_view name) {
  v1::GetModelRequest request;
  request.set_name(std::string(name));
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, name);
    return stub_->GetModel(&context, request, response);
  });
}

absl::StatusOr<v1::ListModelsResponse> NormdClient::ListModels(
    absl::string_view group) {
  v1::ListModelsRequest request;
  request.set_group(std::string(group));
  return Unary<v1::ListModelsResponse>([&](v1::ListModelsResponse* response) {
    grpc::ClientContext context;
    PrepareGroup(context, group);
    return stub_->ListModels(&context, request, response);
  });
}

absl::Status NormdClient::DeleteModel(absl::string_view name) {
  v1::DeleteModelRequest request;
  request.set_name(std::string(name));
  return Unary<v1::DeleteModelResponse>([&](v1::DeleteModelResponse* response) {
           grpc::ClientContext context;
           Prepare(context, name);
           return stub_->DeleteModel(&context, request, response);
         })
      .status();
}

absl::StatusOr<v1::ModelState> NormdClient::ResetModel(absl::string_view name) {
  v1::ResetModelRequest request;
  request.set_name(std::string(name));
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, name);
    return stub_->ResetModel(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::SetReference(
    const v1::SetReferenceRequest& request) {
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, request.model());
    return stub_->SetReference(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::ClearReference(
    absl::string_view name) {
  v1::ClearReferenceRequest request;
  request.set_model(std::string(name));
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, name);
    return stub_->ClearReference(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::ExportModel(
    absl::string_view name) {
  v1::ExportModelRequest request;
  request.set_name(std::string(name));
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, name);
    return stub_->ExportModel(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::ImportModel(
    const v1::ImportModelRequest& request) {
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context,
            request.name().empty() ? request.model().name() : request.name());
    return stub_->ImportModel(&context, request, response);
  });
}

absl::StatusOr<v1::ModelState> NormdClient::MergeModel(
    absl::string_view name, const v1::ModelState& source) {
  v1::MergeModelRequest request;
  request.set_name(std::string(name));
  *request.mutable_source() = source;
  return Unary<v1::ModelState>([&](v1::ModelState* response) {
    grpc::ClientContext context;
    Prepare(context, name);
    return stub_->MergeModel(&context, request, response);
  });
}

absl::StatusOr<std::vector<v1::NormalizeResponse>> NormdClient::NormalizeStream(
    const std::vector<v1::NormalizeRequest>& requests) {
  grpc::ClientContext context;
  Prepare(context, requests.empty() || requests[0].mode() == v1::LAYER_NORM
                       ? ""
                       : requests[0].model());
  auto stream = stub_->NormalizeStream(&context);
  std::vector<v1::NormalizeResponse> responses;
  // Lock-step: one request, one response (keeps memory bounded).
  for (const v1::NormalizeRequest& request : requests) {
    if (!stream->Write(request)) break;
    v1::NormalizeResponse response;
    if (!stream->Read(&response)) break;
    responses.push_back(std::move(response));
  }
  stream->WritesDone();
  v1::NormalizeResponse extra;
  while (stream->Read(&extra)) responses.push_back(std::move(extra));
  grpc::Status status = stream->Finish();
  if (!status.ok()) return FromGrpcStatus(status);
  return responses;
}

absl::StatusOr<v1::FitResponse> NormdClient::FitStream(
    const std::vector<v1::FitRequest>& requests) {
  size_t next_index = 0;
  return FitStream(requests.empty() ? "" : requests[0].model(),
                   options_.timeout, [&](v1::FitRequest& request) {
                     if (next_index == requests.size()) return false;
                     request = requests[next_index++];
                     return true;
                   });
}

absl::StatusOr<v1::FitResponse> NormdClient::FitStream(
    absl::string_view model, absl::Duration deadline,
    const std::function<absl::StatusOr<bool>(v1::FitRequest&)>& next) {
  grpc::ClientContext context;
  Prepare(context, model);
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::FitResponse response;
  auto stream = stub_->FitStream(&context, &response);
  absl::Status produced;
  v1::FitRequest request;
  while (true) {
    absl::StatusOr<bool> more = next(request);
    if (!more.ok()) {
      produced = more.status();
      context.TryCancel();
      break;
    }
    if (!*more || !stream->Write(request)) break;
  }
  if (produced.ok()) stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!produced.ok()) return produced;
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::Status NormdClient::WaitForConnection(absl::Duration timeout) {
  const auto deadline = absl::ToChronoTime(absl::Now() + timeout);
  for (grpc_connectivity_state state = channel_->GetState(true);
       state != GRPC_CHANNEL_READY; state = channel_->GetState(true)) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE) {
      return absl::UnavailableError(
          "connection failed (refused, unresolvable or TLS refused)");
    }
    if (!channel_->WaitForStateChange(state, deadline)) {
      return absl::UnavailableError(absl::StrCat("not connected after ",
                                                 absl::FormatDuration(timeout),
                                                 " (no answer)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
NormdClient::Health(absl::string_view service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  absl::StatusOr<grpc::health::v1::HealthCheckResponse> response =
      Unary<grpc::health::v1::HealthCheckResponse>(
          [&](grpc::health::v1::HealthCheckResponse* out) {
            grpc::ClientContext context;
            Prepare(context, "");
            return health_->Check(&context, request, out);
          });
  if (!response.ok()) return response.status();
  return response->status();
}

}  // namespace normd::client

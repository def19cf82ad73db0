#include "server/http/rest_api.h"

#include <simdjson.h>

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/http/infer_body.h"
#include "server/http/rest_json.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

// What a request holds while it runs, against --max_inflight_bytes: binary
// data once, JSON kJsonMemoryFactor times (the parser's copy, structural
// index and tape take up to 13 bytes per byte of dense numbers such as
// "1,", and the tensors they become more).
constexpr int64_t kJsonMemoryFactor = 16;

int64_t AdmittedBytes(const RestRequestHead& head, int64_t body_bytes) {
  int64_t json = body_bytes;
  uint64_t header_length = 0;
  if (head.header_length.has_value() &&
      absl::SimpleAtoi(*head.header_length, &header_length)) {
    json = std::min<int64_t>(json, static_cast<int64_t>(std::min<uint64_t>(
                                       header_length, 1ull << 62)));
  }
  return body_bytes - json + json * kJsonMemoryFactor;
}

absl::Status BodyTooLarge(int64_t bytes, int64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "body: ", bytes, " bytes, larger than the server's limit of ", limit,
      " bytes (--max_message_bytes)"));
}

RestResponse Json(int status, std::string body) {
  RestResponse response;
  response.status = status;
  response.body = std::move(body);
  return response;
}

// The body of POST /v2/repository/index: empty, or an object whose only
// key is "ready" (a bool; every model normd has is ready).
absl::Status CheckIndexBody(absl::string_view body) {
  if (body.find_first_not_of(" \t\r\n") == absl::string_view::npos) {
    return absl::OkStatus();
  }
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(body.data(), body.size()).get(root) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError("body: malformed JSON");
  }
  simdjson::dom::object object;
  if (root.get_object().get(object) != simdjson::SUCCESS) {
    return absl::InvalidArgumentError("body: must be an object");
  }
  for (const simdjson::dom::key_value_pair member : object) {
    if (member.key != "ready") {
      return absl::InvalidArgumentError(
          absl::StrCat("body: unknown key ",
                       QuotedForMessage(absl::string_view(member.key.data(),
                                                          member.key.size())),
                       "; the index request takes only \"ready\""));
    }
    if (!member.value.is_bool()) {
      return absl::InvalidArgumentError("ready: must be a bool");
    }
  }
  return absl::OkStatus();
}

}  // namespace

RestApi::RestApi(Service& service, Inference& inference, RestLimits limits)
    : service_(service), inference_(inference), limits_(limits) {}

RestResponse RestApi::ErrorResponse(int status, absl::string_view message) {
  RestResponse response = Json(status, ErrorJson(BoundedMessage(message)));
  if (status == 401)
    response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

RestResponse RestApi::ErrorResponse(const absl::Status& status) {
  return ErrorResponse(HttpStatusOf(status.code()), status.message());
}

RestResponse RestApi::Refuse(RestExchange& exchange, const absl::Status& status,
                             int http_status) {
  exchange.call->Finish(status.code());
  RestResponse response = ErrorResponse(http_status, status.message());
  // The body was not read: what is left of it is not a next request.
  response.close = true;
  return response;
}

std::optional<RestResponse> RestApi::Admit(RestExchange& exchange) {
  const RestRequestHead& head = exchange.head;
  absl::StatusOr<RestRoute> route = RouteRestRequest(head.method, head.target);
  if (!route.ok()) return ErrorResponse(route.status());
  exchange.route = *std::move(route);
  const RestRoute& r = exchange.route;
  if (r.endpoint == RestEndpoint::kUnknown) {
    return ErrorResponse(
        404, absl::StrCat(
                 "path: no endpoint ",
                 QuotedForMessage(head.target.substr(0, head.target.find('?'))),
                 "; the endpoints are /v2, /v2/health/live, "
                 "/v2/health/ready, /v2/repository/index, "
                 "/v2/models/stats and "
                 "/v2/models/{name}[/versions/1] with .../ready, "
                 ".../infer, .../config and .../stats"));
  }
  if (!r.method_allowed) {
    RestResponse response = ErrorResponse(
        405, absl::StrCat("method: ", QuotedForMessage(head.method),
                          " is not allowed on ", RestEndpointName(r.endpoint),
                          "; use ", r.allowed));
    response.headers.emplace_back("Allow", r.allowed);
    return response;
  }
  // Only the POST endpoints take a body: one sent to any other is refused
  // before it is read, so that no endpoint reads a body it has not admitted.
  const bool takes_body = r.endpoint == RestEndpoint::kModelInfer ||
                          r.endpoint == RestEndpoint::kRepositoryIndex;
  if (!takes_body && head.content_length.value_or(1) > 0) {
    return ErrorResponse(
        400, absl::StrCat("body: ", RestEndpointName(r.endpoint),
                          " takes none; send the request without a body"));
  }
  exchange.call =
      std::make_unique<Call>(service_, Protocol::kRest, MethodOf(r.endpoint));
  if (IsHealthProbe(r.endpoint)) return std::nullopt;
  if (absl::Status s =
          exchange.call->Authenticate(head.authorization, kHttpTokenCarrier);
      !s.ok()) {
    return Refuse(exchange, s, 401);
  }
  const int64_t declared = static_cast<int64_t>(
      std::min<uint64_t>(head.content_length.value_or(0), uint64_t{1} << 62));
  if (declared > limits_.max_body_bytes) {
    return Refuse(exchange, BodyTooLarge(declared, limits_.max_body_bytes),
                  413);
  }
  if (absl::Status s = exchange.call->Admit(AdmittedBytes(head, declared));
      !s.ok()) {
    return Refuse(exchange, s, 429);
  }
  exchange.received = declared;
  return std::nullopt;
}

std::optional<RestResponse> RestApi::AdmitReceived(RestExchange& exchange,
                                                   int64_t received) {
  if (received > limits_.max_body_bytes) {
    return Refuse(exchange, BodyTooLarge(received, limits_.max_body_bytes),
                  413);
  }
  if (received <= exchange.received) return std::nullopt;
  const int64_t more = AdmittedBytes(exchange.head, received) -
                       AdmittedBytes(exchange.head, exchange.received);
  exchange.received = received;
  if (absl::Status s = exchange.call->AdmitMore(more); !s.ok()) {
    return Refuse(exchange, s, 429);
  }
  return std::nullopt;
}

void RestApi::Handle(RestExchange& exchange, Body body,
                     absl::AnyInvocable<void(RestResponse) &&> done) {
  auto response = std::make_shared<RestResponse>();
  exchange.call->Run([&] { return Respond(exchange, body, *response); },
                     [&exchange, response,
                      done = std::move(done)](absl::Status status) mutable {
                       exchange.call->Finish(status.code());
                       if (!status.ok()) *response = ErrorResponse(status);
                       std::move(done)(std::move(*response));
                     });
}

absl::Status RestApi::Respond(RestExchange& exchange, Body body,
                              RestResponse& response) {
  const RestRoute& route = exchange.route;
  switch (route.endpoint) {
    case RestEndpoint::kHealthLive:
      response = Json(200, HealthJson("live", true));
      return absl::OkStatus();
    case RestEndpoint::kHealthReady: {
      const bool ready = inference_.Ready();
      response = Json(ready ? 200 : 503, HealthJson("ready", ready));
      return absl::OkStatus();
    }
    case RestEndpoint::kServerMetadata:
      response = Json(200, ServerMetadataJson(inference_.ServerMetadata()));
      return absl::OkStatus();
    case RestEndpoint::kModelMetadata: {
      absl::StatusOr<OipModelMetadata> metadata =
          inference_.ModelMetadata(route.model, route.version);
      if (!metadata.ok()) return metadata.status();
      response = Json(200, ModelMetadataJson(*metadata));
      return absl::OkStatus();
    }
    case RestEndpoint::kModelReady: {
      const bool ready = inference_.ModelReady(route.model, route.version);
      // OIP: a 4xx status says "not ready".
      response = Json(ready ? 200 : 400, ModelReadyJson(route.model, ready));
      return absl::OkStatus();
    }
    case RestEndpoint::kModelConfig: {
      absl::StatusOr<OipModelConfig> config =
          inference_.ModelConfig(route.model, route.version);
      if (!config.ok()) return config.status();
      response = Json(200, ModelConfigJson(*config));
      return absl::OkStatus();
    }
    case RestEndpoint::kModelStatistics: {
      absl::StatusOr<std::vector<OipModelStatistics>> stats =
          inference_.Statistics(
              route.model.empty()
                  ? std::nullopt
                  : std::optional<absl::string_view>(route.model),
              route.version);
      if (!stats.ok()) return stats.status();
      response = Json(200, ModelStatisticsJson(*stats));
      return absl::OkStatus();
    }
    case RestEndpoint::kRepositoryIndex: {
      if (absl::Status s = CheckIndexBody(body.bytes); !s.ok()) return s;
      response = Json(200, RepositoryIndexJson(inference_.RepositoryIndex()));
      return absl::OkStatus();
    }
    case RestEndpoint::kModelInfer:
      return Infer(exchange, body, response);
    case RestEndpoint::kUnknown:
      break;
  }
  return absl::InternalError("REST: a request without an endpoint ran");
}

absl::Status RestApi::Infer(RestExchange& exchange, Body body,
                            RestResponse& response) {
  if (body.bytes.empty()) {
    return absl::InvalidArgumentError(
        "body: empty; an infer request is a JSON object with \"inputs\" "
        "(and, with Inference-Header-Content-Length, binary data after it)");
  }
  RestInferRequest parsed;
  if (absl::Status s =
          ParseInferBody(body.bytes, body.readable, exchange.head.header_length,
                         exchange.route.model, exchange.route.version, parsed);
      !s.ok()) {
    return s;
  }
  PooledBuffer output(nullptr, &BufferPool::Release);
  absl::StatusOr<InferReply> reply = inference_.Infer(
      parsed.request,
      [&](const InferOutputPlan& plan) -> absl::StatusOr<OutputPlacement> {
        // The reply holds the output, and its JSON text unless binary.
        const int64_t text = parsed.binary_output
                                 ? 0
                                 : JsonOutputBytes(plan.dtype, plan.elements);
        if (absl::Status s = exchange.call->AdmitMore(plan.bytes + text);
            !s.ok()) {
          return s;
        }
        output = AcquirePooled(
            static_cast<size_t>(std::max<int64_t>(plan.bytes, 1)));
        return OutputPlacement{.data = output.get(),
                               .reply = ReplySize{.bytes = plan.bytes + 256,
                                                  .with_model_arrays = false}};
      });
  if (!reply.ok()) return reply.status();
  const absl::string_view bytes(static_cast<const char*>(output.get()),
                                static_cast<size_t>(reply->output.bytes));
  response.status = 200;
  response.body = FormatInferReply(exchange.route.model, parsed.request.id,
                                   *reply, bytes, parsed.binary_output);
  if (parsed.binary_output) {
    response.content_type = "application/octet-stream";
    response.headers.emplace_back(kInferenceHeaderContentLength,
                                  absl::StrCat(response.body.size()));
    response.payload = std::move(output);
    response.payload_bytes = reply->output.bytes;
  }
  return absl::OkStatus();
}

}  // namespace normd

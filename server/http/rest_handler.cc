#include "server/http/rest_handler.h"

#include <chrono>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/http/connection.h"
#include "server/http/rest_codec.h"
#include "server/rpc/auth.h"
#include "server/rpc/status_mapping.h"
#include "server/rpc/unary_call.h"

namespace normd {
namespace {

constexpr char kJson[] = "application/json";

// When this thread began the request it is answering (httplib answers a
// connection's requests on one thread, one at a time).
thread_local std::optional<std::chrono::steady_clock::time_point> request_start;

std::string Decoded(absl::string_view segment) {
  return httplib::detail::decode_url(std::string(segment), false);
}

absl::string_view PathOf(absl::string_view target) {
  return target.substr(0, target.find('?'));
}

void SetJson(int status, std::string body, httplib::Response& response) {
  response.status = status;
  response.body = std::move(body);
  response.set_header("Content-Type", kJson);
}

// What a request holds while it runs, against --max_inflight_bytes: binary
// data once, JSON kJsonMemoryFactor times (simdjson's copy, structural index
// and tape take up to 13 bytes per byte of dense numbers such as "1,", and
// the tensors they become more).
constexpr int64_t kJsonMemoryFactor = 16;

int64_t AdmittedBytes(const httplib::Request& request, absl::string_view body) {
  uint64_t json = body.size();
  if (request.has_header(kInferenceHeaderContentLength)) {
    json = std::min<uint64_t>(json, request.get_header_value<uint64_t>(
                                        kInferenceHeaderContentLength));
  }
  return static_cast<int64_t>(body.size() - json + json * kJsonMemoryFactor);
}

// The OIP request (ModelMetadata, ModelReady) for a model route.
template <typename Request>
Request ModelQuery(const RestRoute& route) {
  Request query;
  query.set_name(route.model);
  query.set_version(route.version);
  return query;
}

// The message of a refusal httplib made before any handler ran.
std::string RefusalMessage(int status, int64_t max_body_bytes) {
  switch (status) {
    case 413:
      return absl::StrCat("body: larger than the server's limit of ",
                          max_body_bytes, " bytes (--max_message_bytes)");
    case 414:
      return "target: the request's path is too long";
    case 400:
      return "request: not a well-formed HTTP/1.1 request";
    default:
      return absl::StrCat("request: refused with HTTP status ", status);
  }
}

}  // namespace

RestRoute RouteRestRequest(absl::string_view method, absl::string_view target) {
  RestRoute route;
  std::vector<absl::string_view> parts = absl::StrSplit(PathOf(target), '/');
  // An absolute path: "/v2/..." splits into "", "v2", ...
  if (parts.size() < 2 || !parts[0].empty() || parts[1] != "v2") return route;
  parts.erase(parts.begin(), parts.begin() + 2);
  const auto is = [&parts](std::initializer_list<absl::string_view> want) {
    return parts.size() == want.size() &&
           std::equal(want.begin(), want.end(), parts.begin());
  };
  if (parts.empty()) {
    route.endpoint = RestEndpoint::kServerMetadata;
  } else if (is({"health", "live"})) {
    route.endpoint = RestEndpoint::kHealthLive;
  } else if (is({"health", "ready"})) {
    route.endpoint = RestEndpoint::kHealthReady;
  } else if (parts.size() >= 2 && parts[0] == "models" && !parts[1].empty()) {
    route.model = Decoded(parts[1]);
    size_t next = 2;
    if (parts.size() >= 4 && parts[2] == "versions" && !parts[3].empty()) {
      route.version = Decoded(parts[3]);
      next = 4;
    }
    const size_t left = parts.size() - next;
    if (left == 0) {
      route.endpoint = RestEndpoint::kModelMetadata;
    } else if (left == 1 && parts[next] == "ready") {
      route.endpoint = RestEndpoint::kModelReady;
    } else if (left == 1 && parts[next] == "infer") {
      route.endpoint = RestEndpoint::kModelInfer;
    }
  }
  if (route.endpoint == RestEndpoint::kUnknown) return route;
  route.allowed = route.endpoint == RestEndpoint::kModelInfer ? "POST" : "GET";
  route.method_allowed =
      method == route.allowed || (method == "HEAD" && route.allowed[0] == 'G');
  return route;
}

RestHandler::RestHandler(OipService& oip, NormalizerService& native,
                         HttpMetrics& metrics, std::string auth_token)
    : oip_(oip),
      native_(native),
      metrics_(metrics),
      auth_token_(std::move(auth_token)) {}

void RestHandler::Install(httplib::Server& server, int64_t max_body_bytes) {
  const auto handle = [this](const httplib::Request& request,
                             httplib::Response& response) {
    Handle(request, request.body, response);
  };
  // Methods whose body httplib reads: through ReadBodyAndHandle, which caps
  // chunked bodies too.
  const auto read_and_handle = [this, max_body_bytes](
                                   const httplib::Request& request,
                                   httplib::Response& response,
                                   const httplib::ContentReader& reader) {
    ReadBodyAndHandle(request, reader, max_body_bytes, response);
  };
  // Every path of every method: routing is RouteRestRequest's, so that a
  // wrong path is 404 and a wrong method 405, both with a JSON body.
  constexpr char kAnyPath[] = "/.*";
  server.Get(kAnyPath, handle)
      .Post(kAnyPath, read_and_handle)
      .Put(kAnyPath, read_and_handle)
      .Patch(kAnyPath, read_and_handle)
      .Delete(kAnyPath, read_and_handle)
      .Options(kAnyPath, handle);
  server.set_payload_max_length(static_cast<size_t>(max_body_bytes));
  server.set_pre_routing_handler(
      [](const httplib::Request&, httplib::Response&) {
        request_start = std::chrono::steady_clock::now();
        return httplib::Server::HandlerResponse::Unhandled;
      });
  server.set_error_handler(httplib::Server::HandlerWithResponse(
      [max_body_bytes](const httplib::Request&, httplib::Response& response) {
        if (!response.body.empty()) {  // Handle's own error, already a body.
          return httplib::Server::HandlerResponse::Unhandled;
        }
        SetJson(response.status,
                ErrorJson(RefusalMessage(response.status, max_body_bytes)),
                response);
        return httplib::Server::HandlerResponse::Handled;
      }));
  server.set_logger([this](const httplib::Request& request,
                           const httplib::Response& response) {
    // Cut off by the connection guard: counted as its 431 or 408.
    if (RequestRefusedOnThisThread()) return;
    double seconds = 0;
    if (request_start.has_value()) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                              *request_start)
                    .count();
      request_start.reset();
    }
    metrics_.Handled(RouteRestRequest(request.method, request.target).endpoint,
                     response.status, seconds);
  });
}

void RestHandler::ReadBodyAndHandle(const httplib::Request& request,
                                    const httplib::ContentReader& reader,
                                    int64_t max_body_bytes,
                                    httplib::Response& response) {
  // httplib refuses a Content-Length past the limit itself (413); a chunked
  // body is counted here as it arrives, so that no body is held past it.
  std::string body;
  const uint64_t declared =
      request.get_header_value<uint64_t>("Content-Length");
  body.reserve(std::min<uint64_t>(declared, max_body_bytes));
  bool too_large = false;
  const bool complete = reader([&](const char* data, size_t length) {
    if (body.size() + length > static_cast<uint64_t>(max_body_bytes)) {
      too_large = true;
      return false;
    }
    body.append(data, length);
    return true;
  });
  // httplib sets 413 when a Content-Length is past the limit.
  too_large = too_large || response.status == 413;
  if (too_large || !complete) {
    // What is left of the body is not a next request.
    CloseConnectionAfterResponse();
    response.set_header("Connection", "close");
    SetJson(too_large ? 413 : 400,
            ErrorJson(too_large ? RefusalMessage(413, max_body_bytes)
                                : "body: the connection ended before the "
                                  "body was complete"),
            response);
    return;
  }
  Handle(request, body, response);
}

void RestHandler::Handle(const httplib::Request& request,
                         absl::string_view body, httplib::Response& response) {
  const RestRoute route = RouteRestRequest(request.method, request.target);
  absl::Status status;
  if (route.endpoint == RestEndpoint::kUnknown) {
    status = absl::NotFoundError(absl::StrCat(
        "path: no endpoint ", QuotedForMessage(PathOf(request.target)),
        "; the endpoints are /v2, /v2/health/live, /v2/health/ready, "
        "/v2/models/{name}[/versions/1], .../ready and .../infer"));
  } else if (!route.method_allowed) {
    SetJson(
        405,
        ErrorJson(absl::StrCat("method: ", QuotedForMessage(request.method),
                               " is not allowed on ", PathOf(request.target),
                               "; use ", route.allowed)),
        response);
    response.set_header("Allow", route.allowed);
    return;
  } else {
    status = Guarded([&] { return Run(route, request, body, response); });
  }
  if (status.ok()) return;
  SetJson(HttpStatusOf(status.code()),
          ErrorJson(BoundedMessage(status.message())), response);
  if (status.code() == absl::StatusCode::kUnauthenticated) {
    response.set_header("WWW-Authenticate", "Bearer");
  }
}

absl::Status RestHandler::Authenticate(const httplib::Request& request) const {
  if (auth_token_.empty() ||
      BearerTokenMatches(request.get_header_value("Authorization"),
                         auth_token_)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "Authorization: this server needs the header \"Authorization: Bearer "
      "<token>\" with its token (--auth_token_file); it was missing or wrong");
}

absl::Status RestHandler::Run(const RestRoute& route,
                              const httplib::Request& request,
                              absl::string_view body,
                              httplib::Response& response) {
  switch (route.endpoint) {
    case RestEndpoint::kHealthLive:
      SetJson(200, HealthJson("live", true), response);
      return absl::OkStatus();
    case RestEndpoint::kHealthReady: {
      const bool ready = oip_.Ready();
      SetJson(ready ? 200 : 503, HealthJson("ready", ready), response);
      return absl::OkStatus();
    }
    default:
      break;
  }
  if (absl::Status s = Authenticate(request); !s.ok()) return s;
  absl::StatusOr<Admission::Ticket> ticket =
      native_.admission().Admit(1, AdmittedBytes(request, body));
  if (!ticket.ok()) {
    native_.metrics().Rejected();
    return ticket.status();
  }
  native_.metrics().AddInflight(1);
  struct InflightEnd {
    ServerMetrics& metrics;
    ~InflightEnd() { metrics.AddInflight(-1); }
  } inflight_end{native_.metrics()};
  switch (route.endpoint) {
    case RestEndpoint::kServerMetadata: {
      inference::ServerMetadataResponse reply;
      if (absl::Status s = oip_.DoServerMetadata({}, reply); !s.ok()) return s;
      SetJson(200, ServerMetadataJson(reply), response);
      return absl::OkStatus();
    }
    case RestEndpoint::kModelMetadata: {
      inference::ModelMetadataResponse reply;
      if (absl::Status s = oip_.DoModelMetadata(
              ModelQuery<inference::ModelMetadataRequest>(route), reply);
          !s.ok()) {
        return s;
      }
      SetJson(200, ModelMetadataJson(reply), response);
      return absl::OkStatus();
    }
    case RestEndpoint::kModelReady: {
      inference::ModelReadyResponse reply;
      if (absl::Status s = oip_.DoModelReady(
              ModelQuery<inference::ModelReadyRequest>(route), reply);
          !s.ok()) {
        return s;
      }
      // OIP: a 4xx status says "not ready".
      SetJson(reply.ready() ? 200 : 400,
              ModelReadyJson(route.model, reply.ready()), response);
      return absl::OkStatus();
    }
    default:
      return Infer(route, request, body, response);
  }
}

absl::Status RestHandler::Infer(const RestRoute& route,
                                const httplib::Request& request,
                                absl::string_view body,
                                httplib::Response& response) {
  std::string header_length;
  const bool has_header_length =
      request.has_header(kInferenceHeaderContentLength);
  if (has_header_length) {
    header_length = request.get_header_value(kInferenceHeaderContentLength);
  }
  RestInferRequest parsed;
  if (absl::Status s = ParseRestInferRequest(
          body,
          has_header_length ? std::optional<absl::string_view>(header_length)
                            : std::nullopt,
          route.model, route.version, parsed);
      !s.ok()) {
    return s;
  }
  inference::ModelInferResponse reply;
  if (absl::Status s = oip_.DoModelInfer(parsed.message, reply); !s.ok()) {
    return s;
  }
  RestBody answer;
  FormatRestInferResponse(reply, parsed.binary_output, answer);
  response.status = 200;
  response.body = std::move(answer.bytes);
  if (answer.json_bytes.has_value()) {
    response.set_header(kInferenceHeaderContentLength,
                        std::to_string(*answer.json_bytes));
    response.set_header("Content-Type", "application/octet-stream");
  } else {
    response.set_header("Content-Type", kJson);
  }
  return absl::OkStatus();
}

}  // namespace normd

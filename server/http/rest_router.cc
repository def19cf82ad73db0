#include "server/http/rest_router.h"

#include <algorithm>
#include <initializer_list>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

constexpr const char* kEndpointNames[kNumRestEndpoints] = {
    "server_metadata",  "health_live", "health_ready", "model_metadata",
    "model_ready",      "infer",       "model_config", "model_statistics",
    "repository_index", "unknown"};

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

const char* RestEndpointName(RestEndpoint endpoint) {
  return kEndpointNames[static_cast<int>(endpoint)];
}

Method MethodOf(RestEndpoint endpoint) {
  switch (endpoint) {
    case RestEndpoint::kServerMetadata:
      return Method::kServerMetadata;
    case RestEndpoint::kHealthLive:
      return Method::kServerLive;
    case RestEndpoint::kHealthReady:
      return Method::kServerReady;
    case RestEndpoint::kModelMetadata:
      return Method::kModelMetadata;
    case RestEndpoint::kModelReady:
      return Method::kModelReady;
    case RestEndpoint::kModelConfig:
      return Method::kModelConfig;
    case RestEndpoint::kModelStatistics:
      return Method::kModelStatistics;
    case RestEndpoint::kRepositoryIndex:
      return Method::kRepositoryIndex;
    case RestEndpoint::kModelInfer:
    case RestEndpoint::kUnknown:
      break;
  }
  return Method::kModelInfer;
}

std::optional<std::string> PercentDecoded(absl::string_view segment) {
  std::string out;
  out.reserve(segment.size());
  for (size_t i = 0; i < segment.size(); ++i) {
    if (segment[i] != '%') {
      out.push_back(segment[i]);
      continue;
    }
    if (i + 2 >= segment.size()) return std::nullopt;
    const int high = HexValue(segment[i + 1]);
    const int low = HexValue(segment[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out.push_back(static_cast<char>(high << 4 | low));
    i += 2;
  }
  return out;
}

absl::StatusOr<RestRoute> RouteRestRequest(absl::string_view method,
                                           absl::string_view target) {
  RestRoute route;
  const absl::string_view path = target.substr(0, target.find('?'));
  std::vector<absl::string_view> parts = absl::StrSplit(path, '/');
  // An absolute path: "/v2/..." splits into "", "v2", ...
  if (parts.size() < 2 || !parts[0].empty() || parts[1] != "v2") return route;
  parts.erase(parts.begin(), parts.begin() + 2);
  const auto is = [&parts](std::initializer_list<absl::string_view> want) {
    return parts.size() == want.size() &&
           std::equal(want.begin(), want.end(), parts.begin());
  };
  const auto decoded = [&](absl::string_view segment,
                           std::string& out) -> absl::Status {
    std::optional<std::string> text = PercentDecoded(segment);
    if (!text.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat("path: ", QuotedForMessage(path),
                       " has a \"%\" not followed by two hex digits"));
    }
    out = *std::move(text);
    return absl::OkStatus();
  };
  if (parts.empty()) {
    route.endpoint = RestEndpoint::kServerMetadata;
  } else if (is({"health", "live"})) {
    route.endpoint = RestEndpoint::kHealthLive;
  } else if (is({"health", "ready"})) {
    route.endpoint = RestEndpoint::kHealthReady;
  } else if (is({"repository", "index"})) {
    route.endpoint = RestEndpoint::kRepositoryIndex;
  } else if (is({"models", "stats"})) {
    route.endpoint = RestEndpoint::kModelStatistics;
  } else if (parts.size() >= 2 && parts[0] == "models" && !parts[1].empty()) {
    if (absl::Status s = decoded(parts[1], route.model); !s.ok()) return s;
    size_t next = 2;
    if (parts.size() >= 4 && parts[2] == "versions" && !parts[3].empty()) {
      if (absl::Status s = decoded(parts[3], route.version); !s.ok()) return s;
      next = 4;
    }
    const size_t left = parts.size() - next;
    if (left == 0) {
      route.endpoint = RestEndpoint::kModelMetadata;
    } else if (left == 1) {
      const absl::string_view last = parts[next];
      route.endpoint = last == "ready"    ? RestEndpoint::kModelReady
                       : last == "infer"  ? RestEndpoint::kModelInfer
                       : last == "config" ? RestEndpoint::kModelConfig
                       : last == "stats"  ? RestEndpoint::kModelStatistics
                                          : RestEndpoint::kUnknown;
    }
  }
  if (route.endpoint == RestEndpoint::kUnknown) return route;
  const bool post = route.endpoint == RestEndpoint::kModelInfer ||
                    route.endpoint == RestEndpoint::kRepositoryIndex;
  route.allowed = post ? "POST" : "GET, HEAD";
  route.method_allowed =
      post ? method == "POST" : (method == "GET" || method == "HEAD");
  return route;
}

}  // namespace normd

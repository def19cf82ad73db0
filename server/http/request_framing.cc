#include "server/http/request_framing.h"

#include <algorithm>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace normd {

namespace http = boost::beast::http;

namespace {

// A load balancer's health check: GET or HEAD of a health endpoint.
bool IsHealthProbe(const http::request_header<>& head) {
  if (head.method() != http::verb::get && head.method() != http::verb::head) {
    return false;
  }
  const boost::beast::string_view target = head.target();
  const boost::beast::string_view path =
      target.substr(0, std::min(target.size(), target.find('?')));
  return path == "/v2/health/live" || path == "/v2/health/ready";
}

}  // namespace

std::optional<FramingRefusal> CheckFraming(const http::request_header<>& head) {
  const auto hosts = head.equal_range(http::field::host);
  const auto count = std::distance(hosts.first, hosts.second);
  if (head.version() == 10 && IsHealthProbe(head) && count <= 1 &&
      head.count(http::field::content_length) == 0 &&
      head.count(http::field::transfer_encoding) == 0) {
    return std::nullopt;
  }
  if (head.version() != 11) {
    return FramingRefusal{
        505, absl::StrCat("version: HTTP/", head.version() / 10, ".",
                          head.version() % 10,
                          " is not served (but for GET of /v2/health/live and "
                          "/v2/health/ready); normd speaks HTTP/1.1")};
  }
  if (count != 1) {
    return FramingRefusal{
        400, count == 0 ? "Host: an HTTP/1.1 request must have a Host header"
                        : "Host: given more than once"};
  }
  const auto encodings = head.equal_range(http::field::transfer_encoding);
  const auto te_count = std::distance(encodings.first, encodings.second);
  if (te_count == 0) return std::nullopt;
  if (head.count(http::field::content_length) > 0) {
    return FramingRefusal{
        400,
        "Transfer-Encoding: together with Content-Length; send one of them"};
  }
  const auto value = encodings.first->value();
  if (te_count > 1 ||
      !absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(absl::string_view(
                                  value.data(), value.size())),
                              "chunked")) {
    return FramingRefusal{400,
                          "Transfer-Encoding: only \"chunked\" is supported"};
  }
  return std::nullopt;
}

FramingRefusal RefusalOfParseError(const boost::beast::error_code& error) {
  if (error == http::error::header_limit) {
    return {431,
            "headers: the request line and headers are larger than the "
            "server's limit (--http_max_header_bytes)"};
  }
  if (error == http::error::body_limit) {
    return {413, "body: larger than the server's limit (--max_message_bytes)"};
  }
  if (error == http::error::bad_content_length) {
    return {400,
            "Content-Length: not one decimal length (or beside "
            "Transfer-Encoding, or two that differ)"};
  }
  if (error == http::error::bad_transfer_encoding) {
    return {400,
            "Transfer-Encoding: repeated, or beside Content-Length; send "
            "one of them"};
  }
  return {400, absl::StrCat("request: not a well-formed HTTP/1.1 request (",
                            error.message(), ")")};
}

RestRequestHead HeadOf(const http::request_parser<http::string_body>& parser) {
  const http::request_header<>& head = parser.get().base();
  const auto header = [&](http::field name) -> std::optional<std::string> {
    const auto it = head.find(name);
    if (it == head.end()) return std::nullopt;
    return std::string(it->value());
  };
  RestRequestHead request;
  request.method = std::string(head.method_string());
  request.target = std::string(head.target());
  request.authorization = header(http::field::authorization);
  const auto length = head.find("Inference-Header-Content-Length");
  if (length != head.end())
    request.header_length = std::string(length->value());
  if (!parser.chunked())
    request.content_length = parser.content_length().value_or(0);
  return request;
}

}  // namespace normd

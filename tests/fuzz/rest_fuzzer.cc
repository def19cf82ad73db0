// libFuzzer target over the REST front end request by request, as a
// connection hands each to the RestApi (http_fuzzer drives the connection
// itself, on a socket, with its timers; this one sees what the wire cannot
// show: each request's route and service call, and the state after each
// answer). The input is the bytes a client sends on one keep-alive connection
// (request lines, headers, bodies, chunked encoding, pipelined requests), read
// by Beast's parser with the connection's limits, checked by the framing rules
// (request_framing.h), and answered by the RestApi with a bearer token
// configured: routing, the token, admission, the JSON parser, the
// binary-data extension, the Open Inference Protocol's translation, the
// kernels and the model store. Invariants, beyond no crash or sanitizer
// report:
//   - never a 500: every bad input has a 4xx status naming what is wrong,
//     in a JSON body {"error": ...};
//   - 401 exactly when a routed, non-probe request lacks the token;
//   - a request answered with an error changes no model;
//   - a request answered before its body was read closes the connection.
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "server/http/request_framing.h"
#include "server/http/rest_api.h"
#include "tests/fuzz/rest_fixture.h"

namespace {

namespace http = boost::beast::http;
using normd::RestApi;
using normd::RestExchange;
using normd::RestResponse;
using normd::fuzzing::kRestMaxBody;

void CheckAnswer(const RestResponse& response) {
  normd::fuzzing::CheckRestAnswer(response.status, response.body);
}
[[noreturn]] void Fail(const char* what, const RestResponse& response) {
  normd::fuzzing::FailAnswer(what, response.status, response.body);
}

// Feeds `buffer` to `parser` until it needs more than there is; false on a
// parse error (answered, and the connection closed).
bool Put(http::request_parser<http::string_body>& parser,
         boost::beast::flat_buffer& buffer, bool header_only) {
  while (buffer.size() > 0 &&
         !(header_only ? parser.is_header_done() : parser.is_done())) {
    boost::beast::error_code ec;
    const size_t used = parser.put(buffer.data(), ec);
    buffer.consume(used);
    if (ec == http::error::need_more) return true;
    if (ec) {
      RestResponse refusal =
          RestApi::ErrorResponse(normd::RefusalOfParseError(ec).status,
                                 normd::RefusalOfParseError(ec).message);
      CheckAnswer(refusal);
      return false;
    }
    if (used == 0) return true;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* fixture = new normd::fuzzing::RestFixture;
  if (size == 0) return 0;
  boost::beast::flat_buffer buffer = normd::fuzzing::BufferOf(
      absl::string_view(reinterpret_cast<const char*>(data), size));
  // Pipelined requests on one connection, as keep-alive delivers them.
  for (int request = 0; request < 8 && buffer.size() > 0; ++request) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(16 << 10);
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    if (!Put(parser, buffer, /*header_only=*/true)) return 0;
    if (!parser.is_header_done()) return 0;  // A timeout (408) in life.
    if (std::optional<normd::FramingRefusal> refused =
            normd::CheckFraming(parser.get().base())) {
      if (refused->status != 400 && refused->status != 505) abort();
      return 0;
    }
    RestExchange exchange;
    exchange.head = normd::HeadOf(parser);
    const uint64_t before = fixture->Fingerprint();
    const bool has_body = !parser.is_done();
    const bool has_token = normd::fuzzing::CarriesToken(exchange.head);
    if (std::optional<RestResponse> early = fixture->api.Admit(exchange)) {
      CheckAnswer(*early);
      const bool probe = normd::IsHealthProbe(exchange.route.endpoint);
      if ((early->status == 401) !=
          (exchange.call != nullptr && !probe && !has_token)) {
        Fail("401 for a request with the token, or none without", *early);
      }
      if (fixture->Fingerprint() != before) Fail("a refusal changed", *early);
      if (has_body) {
        if (!early->close && early->status != 404 && early->status != 405 &&
            early->status != 400) {
          Fail("answered unread and kept open", *early);
        }
        return 0;  // Closed after the answer: the rest is not a request.
      }
      continue;
    }
    if (exchange.call != nullptr && !has_token &&
        !normd::IsHealthProbe(exchange.route.endpoint)) {
      fprintf(stderr, "admitted without the token: %s\n",
              exchange.head.target.c_str());
      abort();
    }
    if (has_body) {
      parser.body_limit(kRestMaxBody);
      if (!Put(parser, buffer, /*header_only=*/false)) return 0;
      if (!exchange.head.content_length.has_value()) {
        if (std::optional<RestResponse> refused = fixture->api.AdmitReceived(
                exchange, static_cast<int64_t>(parser.get().body().size()))) {
          CheckAnswer(*refused);
          return 0;
        }
      }
      if (!parser.is_done()) return 0;  // A timeout (408) in life.
    }
    RestResponse answer;
    std::string& body = parser.get().body();
    fixture->api.Handle(
        exchange, RestApi::Body{body, body.capacity()},
        [&](RestResponse response) { answer = std::move(response); });
    CheckAnswer(answer);
    if (answer.status >= 400 && fixture->Fingerprint() != before) {
      Fail("a failed request changed a model", answer);
    }
  }
  fixture->Trim();
  return 0;
}

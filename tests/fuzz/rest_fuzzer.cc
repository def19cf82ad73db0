// libFuzzer target over the REST front end as a connection delivers it: the
// input is the bytes a client sends on one keep-alive connection (request
// lines, headers, bodies, chunked encoding, pipelined requests), read by
// Beast's parser with the connection's limits, checked by the framing rules
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
#include <simdjson.h>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "server/http/request_framing.h"
#include "server/http/rest_api.h"
#include "tests/testing/service_stack.h"

namespace {

namespace http = boost::beast::http;
using normd::RestApi;
using normd::RestEndpoint;
using normd::RestExchange;
using normd::RestResponse;

constexpr char kToken[] = "fuzz-token";
constexpr int64_t kMaxBody = 1 << 20;

struct Fixture {
  Fixture() {
    // BatchNorm models for the inputs to find: 4 channels and 1.
    for (const auto& [name, channels] :
         {std::pair<const char*, int>{"bn", 4}, {"bn1", 1}}) {
      normd::ModelSpec spec;
      spec.name = name;
      spec.num_features = channels;
      if (!stack.service.CreateModel(spec).ok()) abort();
    }
  }
  // Every model's generation, summed: changes with any change.
  uint64_t Fingerprint() const {
    uint64_t sum = 0;
    for (const normd::BatchNormModel& m : stack.service.ListModels()) {
      sum += m.generation * 1000003 + m.name.size();
    }
    return sum;
  }
  normd::testing::ServiceStack stack{normd::testing::ServiceStackOptions{
      .auth_token = kToken,
      .max_message_bytes = kMaxBody,
      .store = normd::ModelStoreOptions{64, 4096}}};
  RestApi api{stack.service, stack.inference,
              normd::RestLimits{.max_body_bytes = kMaxBody}};
};

[[noreturn]] void Fail(const char* what, const RestResponse& response) {
  fprintf(stderr, "%s: %d %s\n", what, response.status,
          response.body.substr(0, 600).c_str());
  abort();
}

// Every answer: a status normd answers with, never 500; an error's body is
// {"error": "..."}, but for a readiness check's "not ready" ({"ready":
// false}, 400 or 503 as the protocol has it).
void CheckAnswer(const RestResponse& response) {
  if (response.status == 500) Fail("a 500 answer", response);
  if (response.status < 200 || response.status > 505) {
    Fail("not a status normd answers with", response);
  }
  if (response.status >= 400) {
    simdjson::dom::parser parser;
    simdjson::dom::element root;
    if (parser.parse(response.body).get(root) != simdjson::SUCCESS) {
      Fail("an answer that is not JSON", response);
    }
    const bool not_ready = (response.status == 400 || response.status == 503) &&
                           root["ready"].is_bool() &&
                           !root["ready"].get_bool().value_unsafe();
    if (!root["error"].is_string() && !not_ready) {
      Fail("an error without its JSON body", response);
    }
  }
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
  static Fixture* fixture = new Fixture;
  if (size == 0) return 0;
  boost::beast::flat_buffer buffer;
  auto space = buffer.prepare(size);
  std::memcpy(space.data(), data, size);
  buffer.commit(size);
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
    const bool has_token =
        exchange.head.authorization.has_value() &&
        *exchange.head.authorization == std::string("Bearer ") + kToken;
    if (std::optional<RestResponse> early = fixture->api.Admit(exchange)) {
      CheckAnswer(*early);
      const RestEndpoint endpoint = exchange.route.endpoint;
      const bool probe = endpoint == RestEndpoint::kHealthLive ||
                         endpoint == RestEndpoint::kHealthReady;
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
        exchange.route.endpoint != RestEndpoint::kHealthLive &&
        exchange.route.endpoint != RestEndpoint::kHealthReady) {
      fprintf(stderr, "admitted without the token: %s\n",
              exchange.head.target.c_str());
      abort();
    }
    if (has_body) {
      parser.body_limit(kMaxBody);
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
  // Keep the store small so that iterations stay fast.
  if (fixture->stack.service.store().size() > 32) {
    for (const auto& m : fixture->stack.service.ListModels()) {
      if (m.name != "bn" && m.name != "bn1") {
        (void)fixture->stack.service.DeleteModel(m.name);
      }
    }
  }
  return 0;
}

// What the REST fuzzers share: the service in process with a bearer token
// and two BatchNorm models for inputs to find, a fingerprint of every
// model's state, and the check every answer must pass. Built once per
// fuzzer process; not thread-safe to build (the service itself is).
#ifndef NORMD_TESTS_FUZZ_REST_FIXTURE_H_
#define NORMD_TESTS_FUZZ_REST_FIXTURE_H_

#include <simdjson.h>

#include <boost/beast/core/flat_buffer.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "server/http/request_framing.h"
#include "server/http/rest_api.h"
#include "tests/testing/service_stack.h"

namespace normd::fuzzing {

inline constexpr char kRestToken[] = "fuzz-token";
inline constexpr int64_t kRestMaxBody = 1 << 20;

struct RestFixture {
  RestFixture() {
    // BatchNorm models for the inputs to find: 4 channels and 1.
    for (const auto& [name, channels] :
         {std::pair<const char*, int>{"bn", 4}, {"bn1", 1}}) {
      ModelSpec spec;
      spec.name = name;
      spec.num_features = channels;
      if (!stack.service.CreateModel(spec).ok()) abort();
    }
  }
  // Every model's generation, summed: changes with any change.
  uint64_t Fingerprint() const {
    uint64_t sum = 0;
    for (const BatchNormModel& m : stack.service.ListModels()) {
      sum += m.generation * 1000003 + m.name.size();
    }
    return sum;
  }
  // Keeps the store small so that iterations stay fast.
  void Trim() {
    if (stack.service.store().size() <= 32) return;
    for (const BatchNormModel& m : stack.service.ListModels()) {
      if (m.name != "bn" && m.name != "bn1") {
        (void)stack.service.DeleteModel(m.name);
      }
    }
  }

  testing::ServiceStack stack{
      testing::ServiceStackOptions{.auth_token = kRestToken,
                                   .max_message_bytes = kRestMaxBody,
                                   .store = ModelStoreOptions{64, 4096}}};
  RestApi api{stack.service, stack.inference,
              RestLimits{.max_body_bytes = kRestMaxBody}};
};

// `bytes` as a connection's read buffer holds them.
inline boost::beast::flat_buffer BufferOf(absl::string_view bytes) {
  boost::beast::flat_buffer buffer;
  if (bytes.empty()) return buffer;
  auto space = buffer.prepare(bytes.size());
  std::memcpy(space.data(), bytes.data(), bytes.size());
  buffer.commit(bytes.size());
  return buffer;
}

// Whether a request carries the fixture's token, exactly as RFC 6750 spells
// it (the fuzzers' own check, independent of the server's).
inline bool CarriesToken(const RestRequestHead& head) {
  return head.authorization.has_value() &&
         *head.authorization == std::string("Bearer ") + kRestToken;
}

[[noreturn]] inline void FailAnswer(const char* what, int status,
                                    absl::string_view body) {
  fprintf(stderr, "%s: %d %.*s\n", what, status,
          static_cast<int>(std::min<size_t>(body.size(), 600)), body.data());
  abort();
}

// Every answer: a status normd answers with, never 500; an error's body is
// {"error": "..."}, but for a readiness check's "not ready" ({"ready":
// false}, 400 or 503 as the protocol has it).
inline void CheckRestAnswer(int status, absl::string_view body) {
  if (status == 500) FailAnswer("a 500 answer", status, body);
  if (status < 200 || status > 505) {
    FailAnswer("not a status normd answers with", status, body);
  }
  if (status < 400) return;
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(body.data(), body.size()).get(root) != simdjson::SUCCESS) {
    FailAnswer("an answer that is not JSON", status, body);
  }
  const bool not_ready = (status == 400 || status == 503) &&
                         root["ready"].is_bool() &&
                         !root["ready"].get_bool().value_unsafe();
  if (!root["error"].is_string() && !not_ready) {
    FailAnswer("an error without its JSON body", status, body);
  }
}

}  // namespace normd::fuzzing

#endif  // NORMD_TESTS_FUZZ_REST_FIXTURE_H_

// The in-process services the request fuzzers drive: the NormalizerService
// on a small model store with no admission limits, and the Open Inference
// Protocol's service on it. Built once per fuzzer process; not thread-safe
// (libFuzzer runs one input at a time).
#ifndef NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_
#define NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_

#include <prometheus/registry.h>

#include <string>

#include "google/protobuf/stubs/logging.h"
#include "server/core/engine.h"
#include "server/rpc/admission.h"
#include "server/rpc/health_service.h"
#include "server/rpc/metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"

namespace normd::fuzzing {

struct ServiceFixture {
  ServiceFixture() {
    // Invalid UTF-8 in string fields makes protobuf log each time.
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*,
                                       int, const std::string&) {});
  }
  prometheus::Registry registry;
  ServerMetrics metrics{registry};
  Engine engine{ModelStoreOptions{64, 4096}};
  Admission admission{0, 0};
  NormalizerService service{engine, metrics, admission};
  HealthService health;
  OipService oip{service, health};
};

}  // namespace normd::fuzzing

#endif  // NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_

// The in-process services the request fuzzers drive: the service on a small
// model store with no admission limits, and the gRPC front end's services
// on it. Built once per fuzzer process; not thread-safe (libFuzzer runs one
// input at a time).
#ifndef NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_
#define NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_

#include <string>

#include "google/protobuf/stubs/logging.h"
#include "server/rpc/grpc_metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"
#include "tests/testing/service_stack.h"

namespace normd::fuzzing {

struct ServiceFixture {
  ServiceFixture() {
    // Invalid UTF-8 in string fields makes protobuf log each time.
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*,
                                       int, const std::string&) {});
  }
  testing::ServiceStack stack{
      testing::ServiceStackOptions{.store = ModelStoreOptions{64, 4096}}};
  Engine& engine = stack.engine;
  GrpcMetrics grpc_metrics{stack.registry};
  NormalizerService service{GrpcFrontEnd{stack.service, grpc_metrics}};
  OipService oip{GrpcFrontEnd{stack.service, grpc_metrics}, stack.inference};
};

}  // namespace normd::fuzzing

#endif  // NORMD_TESTS_FUZZ_SERVICE_FIXTURE_H_

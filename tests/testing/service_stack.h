// The protocol-free service in process, as a server builds it: an engine,
// admission, the service, its metrics and the Open Inference Protocol's
// models on it, ready. For the service's tests, the front ends' tests and
// the fuzzers. Not thread-safe to build; the service itself is.
#ifndef NORMD_TESTS_TESTING_SERVICE_STACK_H_
#define NORMD_TESTS_TESTING_SERVICE_STACK_H_

#include <prometheus/registry.h>

#include <cstdint>
#include <string>

#include "server/core/engine.h"
#include "server/service/admission.h"
#include "server/service/inference.h"
#include "server/service/readiness.h"
#include "server/service/service.h"
#include "server/service/service_metrics.h"

namespace normd::testing {

struct ServiceStackOptions {
  std::string auth_token;
  int64_t max_message_bytes = 64 << 20;
  ModelStoreOptions store;
  int64_t max_inflight_requests = 0;  // 0: no limit.
  int64_t max_inflight_bytes = 0;     // 0: no limit.
};

struct ServiceStack {
  explicit ServiceStack(ServiceStackOptions options = {})
      : engine(options.store),
        admission(options.max_inflight_requests, options.max_inflight_bytes),
        service(
            engine, metrics, admission,
            ServiceOptions{.auth_token = options.auth_token,
                           .max_message_bytes = options.max_message_bytes}) {
    readiness.Set(true);
  }

  prometheus::Registry registry;
  ServiceMetrics metrics{registry};
  Engine engine;
  Admission admission;
  Service service;
  Readiness readiness;
  Inference inference{service, readiness, "test"};
};

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_SERVICE_STACK_H_

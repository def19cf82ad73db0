// grpc.health.v1.Health with the real serving status of each service name.
//
// Used instead of gRPC's default health service because that one keeps Watch
// streams open through shutdown, so a single load-balancer watch held every
// drain to its full deadline. Here Shutdown() sends NOT_SERVING to every
// watcher and then ends its stream, so open watches never delay the drain.
//
// Thread-safe: SetServing/Shutdown may be called from any thread while gRPC
// runs Check and Watch on its own threads. Reactions of gRPC write reactors
// are never run inline from StartWrite/Finish, so calling those under mu_ is
// safe.
#ifndef NORMD_SERVER_RPC_HEALTH_SERVICE_H_
#define NORMD_SERVER_RPC_HEALTH_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "server/core/sync.h"

namespace normd {

// Both methods raw: requests that are not a HealthCheckRequest get
// INVALID_ARGUMENT (raw_message.h).
class HealthService final
    : public grpc::health::v1::Health::WithRawCallbackMethod_Check<
          grpc::health::v1::Health::WithRawCallbackMethod_Watch<
              grpc::health::v1::Health::Service>> {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // Sets the status of `service` ("" = the whole server); ignored after
  // Shutdown.
  void SetServing(absl::string_view service, bool serving);

  // Whether `service` ("" = the whole server) is SERVING now.
  bool IsServing(absl::string_view service);

  // Every service NOT_SERVING, every watch told so and then finished; later
  // SetServing calls are ignored.
  void Shutdown();

  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::ByteBuffer* request) override;

 private:
  class Watcher;

  // The status of `service` now (SERVICE_UNKNOWN if never set).
  ServingStatus StatusLocked(const std::string& service) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Register(Watcher* watcher);
  void Unregister(Watcher* watcher);

  Mutex mu_;
  absl::flat_hash_map<std::string, ServingStatus> statuses_
      ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_HEALTH_SERVICE_H_

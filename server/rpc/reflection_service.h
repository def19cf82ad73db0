// gRPC server reflection (grpc.reflection.v1alpha.ServerReflection) over the
// descriptors compiled into normd, so that grpcurl and grpc_cli can list and
// describe its services. Served by normd itself rather than by libgrpc++'s
// reflection plugin so that it can require the same bearer token as the
// Normalizer (--auth_token_file): with a token set, a stream without it is
// refused with UNAUTHENTICATED before anything is described.
//
// Thread-safe: gRPC runs streams on its own threads; each stream's reactor is
// driven by one callback at a time, and streams waiting on their client are
// ended by the shared StreamWatchdog.
#ifndef NORMD_SERVER_RPC_REFLECTION_SERVICE_H_
#define NORMD_SERVER_RPC_REFLECTION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "server/rpc/stream_watchdog.h"

namespace normd {

// Raw: a request that is not a ServerReflectionRequest gets an
// error_response saying INVALID_ARGUMENT, and the stream goes on.
class ReflectionService final
    : public grpc::reflection::v1alpha::ServerReflection::
          WithRawCallbackMethod_ServerReflectionInfo<
              grpc::reflection::v1alpha::ServerReflection::Service> {
 public:
  // `services`: the fully qualified names list_services answers with;
  // `auth_token`: the bearer token a stream must carry (empty: none).
  ReflectionService(std::vector<std::string> services, std::string auth_token,
                    StreamWatchdog& watchdog);

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
  ServerReflectionInfo(grpc::CallbackServerContext* context) override;

 private:
  const std::vector<std::string> services_;
  const std::string auth_token_;
  StreamWatchdog& watchdog_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_REFLECTION_SERVICE_H_

// How normd's gRPC server listens: the transport settings every normd gRPC
// server uses (shared with bench/echo_server, so that the echo baseline runs
// with exactly normd's settings) and the TLS credentials the flags ask for.
// Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_GRPC_TRANSPORT_H_
#define NORMD_SERVER_RPC_GRPC_TRANSPORT_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace normd {

// "host:port", bracketing IPv6 literals.
std::string HostPort(const std::string& host, int port);

// Applies the listening address with `credentials`, the message size limits
// and no port sharing to `builder`; `port` receives the bound port after
// BuildAndStart.
void ConfigureServerBuilder(
    const std::string& bind_address, int port, int64_t max_message_bytes,
    grpc::ServerBuilder& builder, int* bound_port,
    std::shared_ptr<grpc::ServerCredentials> credentials =
        grpc::InsecureServerCredentials());

// The TLS files' server credentials (insecure when cert and key are empty);
// INVALID_ARGUMENT naming the flag for a missing or unreadable file or half
// a pair.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string client_ca;
};
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_GRPC_TRANSPORT_H_

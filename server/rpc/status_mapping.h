// The one place where absl::Status and grpc::Status meet. absl::StatusCode
// and grpc::StatusCode share google.rpc.Code's numbering, so codes map one to
// one and messages are kept. Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_STATUS_MAPPING_H_
#define NORMD_SERVER_RPC_STATUS_MAPPING_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace normd {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_STATUS_MAPPING_H_

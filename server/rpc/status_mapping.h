// The one place where absl::Status meets the protocols' errors: grpc::Status
// (absl::StatusCode and grpc::StatusCode share google.rpc.Code's numbering,
// so codes map one to one) and HTTP statuses (api.md's table). Messages are
// kept, bounded in length. Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_STATUS_MAPPING_H_
#define NORMD_SERVER_RPC_STATUS_MAPPING_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// Error messages are cut to this many bytes (whole UTF-8 characters, with
// "... (N bytes in all)" at the end), so that no input can make a status
// exceed gRPC's metadata limits; the messages normd writes stay well under.
inline constexpr size_t kMaxErrorMessageBytes = 1000;

// `message`, cut to kMaxErrorMessageBytes.
std::string BoundedMessage(absl::string_view message);

// A client's string inside an error message: quoted, C-escaped, at most 64
// bytes of it ("..." after the quote when cut).
std::string QuotedForMessage(absl::string_view text);

// The same code, the message bounded.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// The HTTP status of an error `code` (200 for OK): INVALID_ARGUMENT,
// FAILED_PRECONDITION and OUT_OF_RANGE 400, NOT_FOUND 404, UNAUTHENTICATED
// 401, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, anything else 500.
int HttpStatusOf(absl::StatusCode code);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_STATUS_MAPPING_H_

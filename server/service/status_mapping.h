// The one place where an absl::Status becomes what a protocol sends: the
// gRPC code (google.rpc.Code, whose numbering absl::StatusCode shares, so
// codes map one to one), the HTTP status (api.md's table) and the code's name
// (the metrics' label), with messages bounded in length. Front ends only
// convert types with these. Stateless; thread-safe.
#ifndef NORMD_SERVER_SERVICE_STATUS_MAPPING_H_
#define NORMD_SERVER_SERVICE_STATUS_MAPPING_H_

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

// The google.rpc.Code (gRPC status code) number of `code`: the same number,
// any value outside 0..16 as UNKNOWN (2).
int GrpcCodeOf(absl::StatusCode code);

// The name the gRPC ecosystem's metrics give `code` ("OK",
// "InvalidArgument", "Unauthenticated", ...; "Unknown" for any other value).
const char* GrpcCodeName(absl::StatusCode code);

// The HTTP status of an error `code` (200 for OK): INVALID_ARGUMENT,
// FAILED_PRECONDITION and OUT_OF_RANGE 400, NOT_FOUND 404, UNAUTHENTICATED
// 401, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503, anything else 500.
int HttpStatusOf(absl::StatusCode code);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_STATUS_MAPPING_H_

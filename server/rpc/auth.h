// The bearer-token check every normd service applies (--auth_token_file).
// Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_AUTH_H_
#define NORMD_SERVER_RPC_AUTH_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// Whether `authorization` (a header's value) is "Bearer <token>", compared
// in constant time (the comparison does not reveal how much matched).
bool BearerTokenMatches(absl::string_view authorization,
                        absl::string_view token);

// OK if `token` is empty or the call carries "authorization: Bearer
// <token>" (compared in constant time); UNAUTHENTICATED naming the metadata
// otherwise.
absl::Status CheckBearerToken(const grpc::CallbackServerContext& context,
                              absl::string_view token);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_AUTH_H_

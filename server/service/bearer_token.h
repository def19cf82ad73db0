// The bearer-token decision every front end applies (--auth_token_file):
// whether the credentials a call presents carry the server's token.
// Stateless; thread-safe.
#ifndef NORMD_SERVER_SERVICE_BEARER_TOKEN_H_
#define NORMD_SERVER_SERVICE_BEARER_TOKEN_H_

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// Whether `authorization` (a header's or metadata's value) is "Bearer
// <token>", compared in constant time (the comparison does not reveal how
// much matched).
bool BearerTokenMatches(absl::string_view authorization,
                        absl::string_view token);

// Where a protocol carries the token, for the message of a refusal: e.g.
// {"authorization", "metadata"} for gRPC, {"Authorization", "header"} for
// HTTP.
struct TokenCarrier {
  absl::string_view key;
  absl::string_view kind;
};

// OK if `token` is empty or `authorization` (nullopt: none sent) is "Bearer
// <token>"; UNAUTHENTICATED naming the carrier otherwise.
absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token, TokenCarrier carrier);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_BEARER_TOKEN_H_

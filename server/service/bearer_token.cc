#include "server/service/bearer_token.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace normd {

bool BearerTokenMatches(absl::string_view authorization,
                        absl::string_view token) {
  const std::string expected = absl::StrCat("Bearer ", token);
  if (authorization.size() != expected.size()) return false;
  unsigned char differ = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    differ |= static_cast<unsigned char>(authorization[i] ^ expected[i]);
  }
  return differ == 0;
}

absl::Status CheckBearerToken(std::optional<absl::string_view> authorization,
                              absl::string_view token, TokenCarrier carrier) {
  if (token.empty() || (authorization.has_value() &&
                        BearerTokenMatches(*authorization, token))) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(absl::StrCat(
      carrier.key, ": this server needs the ", carrier.kind, " \"", carrier.key,
      ": Bearer <token>\" with its token (--auth_token_file); it was ",
      authorization.has_value() ? "wrong" : "missing"));
}

}  // namespace normd

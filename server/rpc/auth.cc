#include "server/rpc/auth.h"

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

absl::Status CheckBearerToken(const grpc::CallbackServerContext& context,
                              absl::string_view token) {
  if (token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it != metadata.end() &&
      BearerTokenMatches(
          absl::string_view(it->second.data(), it->second.size()), token)) {
    return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "authorization: this server needs the metadata \"authorization: Bearer "
      "<token>\" with its token (--auth_token_file); it was missing or wrong");
}

}  // namespace normd

#include "server/rpc/auth.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace normd {

absl::Status CheckBearerToken(const grpc::CallbackServerContext& context,
                              absl::string_view token) {
  if (token.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  const std::string expected = absl::StrCat("Bearer ", token);
  if (it != metadata.end() && it->second.size() == expected.size()) {
    // Constant time: the comparison does not reveal how much matched.
    unsigned char differ = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      differ |= static_cast<unsigned char>(it->second.data()[i] ^ expected[i]);
    }
    if (differ == 0) return absl::OkStatus();
  }
  return absl::UnauthenticatedError(
      "authorization: this server needs the metadata \"authorization: Bearer "
      "<token>\" with its token (--auth_token_file); it was missing or wrong");
}

}  // namespace normd

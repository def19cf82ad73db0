#include "server/rpc/status_mapping.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace normd {

static_assert(static_cast<int>(absl::StatusCode::kInvalidArgument) ==
                  static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT) &&
              static_cast<int>(absl::StatusCode::kUnauthenticated) ==
                  static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));

std::string BoundedMessage(absl::string_view message) {
  if (message.size() <= kMaxErrorMessageBytes) return std::string(message);
  const std::string suffix =
      absl::StrCat("... (", message.size(), " bytes in all)");
  size_t keep = kMaxErrorMessageBytes - suffix.size();
  // Never cut a UTF-8 sequence: back up over continuation bytes.
  while (keep > 0 &&
         (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) {
    --keep;
  }
  return absl::StrCat(message.substr(0, keep), suffix);
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      BoundedMessage(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace normd

#include "server/rpc/status_mapping.h"

#include <string>

#include "absl/strings/escaping.h"
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

std::string QuotedForMessage(absl::string_view text) {
  constexpr size_t kShown = 64;
  const bool cut = text.size() > kShown;
  return absl::StrCat("\"", absl::CHexEscape(text.substr(0, kShown)),
                      cut ? "...\"" : "\"");
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

int HttpStatusOf(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kUnauthenticated:
      return 401;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    default:
      return 500;
  }
}

}  // namespace normd

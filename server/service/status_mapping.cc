#include "server/service/status_mapping.h"

#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace normd {
namespace {

constexpr const char* kCodeNames[] = {
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
};
constexpr int kNumCodes = sizeof(kCodeNames) / sizeof(kCodeNames[0]);

}  // namespace

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

int GrpcCodeOf(absl::StatusCode code) {
  const int number = static_cast<int>(code);
  return number >= 0 && number < kNumCodes
             ? number
             : static_cast<int>(absl::StatusCode::kUnknown);
}

const char* GrpcCodeName(absl::StatusCode code) {
  return kCodeNames[GrpcCodeOf(code)];
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

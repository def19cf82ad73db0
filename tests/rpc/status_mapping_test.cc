// The one status mapping (server/service/status_mapping.h) as the gRPC
// front end applies it (server/rpc/grpc_status.h): every code maps to the
// gRPC code of the same name and that code's metric name, and messages are
// bounded without cutting a UTF-8 character.
#include "server/service/status_mapping.h"

#include <grpcpp/support/status.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "server/rpc/grpc_status.h"

namespace normd {
namespace {

TEST(StatusMappingTest, EveryCodeMapsToTheGrpcCodeOfTheSameName) {
  const std::pair<absl::StatusCode, grpc::StatusCode> names[] = {
      {absl::StatusCode::kCancelled, grpc::StatusCode::CANCELLED},
      {absl::StatusCode::kUnknown, grpc::StatusCode::UNKNOWN},
      {absl::StatusCode::kInvalidArgument, grpc::StatusCode::INVALID_ARGUMENT},
      {absl::StatusCode::kDeadlineExceeded,
       grpc::StatusCode::DEADLINE_EXCEEDED},
      {absl::StatusCode::kNotFound, grpc::StatusCode::NOT_FOUND},
      {absl::StatusCode::kAlreadyExists, grpc::StatusCode::ALREADY_EXISTS},
      {absl::StatusCode::kPermissionDenied,
       grpc::StatusCode::PERMISSION_DENIED},
      {absl::StatusCode::kResourceExhausted,
       grpc::StatusCode::RESOURCE_EXHAUSTED},
      {absl::StatusCode::kFailedPrecondition,
       grpc::StatusCode::FAILED_PRECONDITION},
      {absl::StatusCode::kAborted, grpc::StatusCode::ABORTED},
      {absl::StatusCode::kOutOfRange, grpc::StatusCode::OUT_OF_RANGE},
      {absl::StatusCode::kUnimplemented, grpc::StatusCode::UNIMPLEMENTED},
      {absl::StatusCode::kInternal, grpc::StatusCode::INTERNAL},
      {absl::StatusCode::kUnavailable, grpc::StatusCode::UNAVAILABLE},
      {absl::StatusCode::kDataLoss, grpc::StatusCode::DATA_LOSS},
      {absl::StatusCode::kUnauthenticated, grpc::StatusCode::UNAUTHENTICATED},
  };
  for (const auto& [absl_code, grpc_code] : names) {
    const grpc::Status to = ToGrpcStatus(absl::Status(absl_code, "field: why"));
    EXPECT_EQ(to.error_code(), grpc_code)
        << absl::StatusCodeToString(absl_code);
    EXPECT_EQ(to.error_message(), "field: why");
  }
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  // A code outside google.rpc.Code's range is UNKNOWN.
  EXPECT_EQ(ToGrpcStatus(absl::Status(static_cast<absl::StatusCode>(42), "x"))
                .error_code(),
            grpc::StatusCode::UNKNOWN);
}

// The metrics' code label: go-grpc-prometheus's names, by hand from its
// table.
TEST(StatusMappingTest, CodesHaveTheGrpcEcosystemsMetricNames) {
  EXPECT_STREQ(GrpcCodeName(absl::StatusCode::kOk), "OK");
  EXPECT_STREQ(GrpcCodeName(absl::StatusCode::kCancelled), "Canceled");
  EXPECT_STREQ(GrpcCodeName(absl::StatusCode::kInvalidArgument),
               "InvalidArgument");
  EXPECT_STREQ(GrpcCodeName(absl::StatusCode::kResourceExhausted),
               "ResourceExhausted");
  EXPECT_STREQ(GrpcCodeName(absl::StatusCode::kUnauthenticated),
               "Unauthenticated");
  EXPECT_STREQ(GrpcCodeName(static_cast<absl::StatusCode>(99)), "Unknown");
}

TEST(StatusMappingTest, LongMessagesAreCutAtWholeCharacters) {
  const std::string fits(kMaxErrorMessageBytes, 'a');
  EXPECT_EQ(BoundedMessage(fits), fits);
  // 5000 two-byte characters: cut to at most kMaxErrorMessageBytes, ending
  // with the full length, never inside a character.
  std::string long_message;
  for (int i = 0; i < 5000; ++i) long_message += "\xC3\xA9";  // U+00E9.
  const std::string cut = BoundedMessage(long_message);
  EXPECT_LE(cut.size(), kMaxErrorMessageBytes);
  const std::string suffix = "... (10000 bytes in all)";
  ASSERT_TRUE(absl::EndsWith(cut, suffix)) << cut.substr(cut.size() - 40);
  const std::string kept = cut.substr(0, cut.size() - suffix.size());
  EXPECT_EQ(kept.size() % 2, 0u);
  EXPECT_EQ(kept, long_message.substr(0, kept.size()));
  EXPECT_GT(kept.size(), kMaxErrorMessageBytes - suffix.size() - 2);
  // The gRPC status carries the bounded message.
  EXPECT_EQ(
      ToGrpcStatus(absl::InvalidArgumentError(long_message)).error_message(),
      cut);
}

}  // namespace
}  // namespace normd

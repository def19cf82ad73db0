// What the gRPC front end needs to speak the service's language: an
// absl::Status as a grpc::Status (codes and bounded messages from
// status_mapping.h, the one mapping) and the bearer token a call presents in
// its metadata. Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_GRPC_STATUS_H_
#define NORMD_SERVER_RPC_GRPC_STATUS_H_

#include <grpcpp/grpcpp.h>

#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/service/bearer_token.h"
#include "server/service/status_mapping.h"

namespace normd {

// Where gRPC calls carry the bearer token.
inline constexpr TokenCarrier kGrpcTokenCarrier{"authorization", "metadata"};

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(GrpcCodeOf(status.code())),
                      BoundedMessage(status.message()));
}

// The value of the call's `key` metadata (a view into the call's own
// metadata, valid while the call is); nullopt when absent.
inline std::optional<absl::string_view> MetadataView(
    const grpc::CallbackServerContext& context, absl::string_view key) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find(grpc::string_ref(key.data(), key.size()));
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

// The value of the call's "authorization" metadata; nullopt when absent.
inline std::optional<absl::string_view> AuthorizationOf(
    const grpc::CallbackServerContext& context) {
  return MetadataView(context, "authorization");
}

// The value of the call's `key` metadata, copied; nullopt when absent.
inline std::optional<std::string> MetadataValue(
    const grpc::CallbackServerContext& context, absl::string_view key) {
  const std::optional<absl::string_view> value = MetadataView(context, key);
  if (!value.has_value()) return std::nullopt;
  return std::string(*value);
}

}  // namespace normd

#endif  // NORMD_SERVER_RPC_GRPC_STATUS_H_

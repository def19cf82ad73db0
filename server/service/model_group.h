// A model's group: its name up to the first '.' (the whole name if it has
// none). A checkpoint imported under prefix P is the models P.<layer>, one
// group, so a sharding proxy that hashes the group keeps a checkpoint's
// layers on one replica. Every client sends the group as the routing header
// kRoutingGroupHeader (gRPC metadata or HTTP header alike); the server only
// checks it against the names a call creates or lists, and never routes.
// Stateless functions; thread-safe.
#ifndef NORMD_SERVER_SERVICE_MODEL_GROUP_H_
#define NORMD_SERVER_SERVICE_MODEL_GROUP_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/model.h"

namespace normd {

inline constexpr char kRoutingGroupHeader[] = "x-normd-group";

// "resnet.layer1.0.bn1" -> "resnet"; "m" -> "m".
absl::string_view ModelGroup(absl::string_view name);

// INVALID_ARGUMENT naming `field` unless `group` is a group: not empty and
// without a '.'.
absl::Status ValidateGroup(absl::string_view group, absl::string_view field);

// CreateModels behind a proxy: when the call was routed by `routed_group`
// (the routing header was sent), every model must be in that group, else
// INVALID_ARGUMENT naming models[i]. Without the header any names go
// together (a call straight to one replica).
absl::Status CheckRoutedGroup(absl::Span<const ModelSpec> specs,
                              const std::optional<std::string>& routed_group);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_MODEL_GROUP_H_

#include "server/service/model_group.h"

#include "absl/strings/str_cat.h"

namespace normd {

absl::string_view ModelGroup(absl::string_view name) {
  return name.substr(0, name.find('.'));
}

absl::Status ValidateGroup(absl::string_view group, absl::string_view field) {
  if (group.empty() || group.find('.') != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": '", group,
        "' is not a group (a model name up to its first '.', not empty)"));
  }
  return absl::OkStatus();
}

absl::Status CheckRoutedGroup(absl::Span<const ModelSpec> specs,
                              const std::optional<std::string>& routed_group) {
  if (!routed_group.has_value()) return absl::OkStatus();
  if (absl::Status s = ValidateGroup(*routed_group, kRoutingGroupHeader);
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (ModelGroup(specs[i].name) != *routed_group) {
      return absl::InvalidArgumentError(absl::StrCat(
          "models[", i, "].name: '", specs[i].name, "' is in group '",
          ModelGroup(specs[i].name), "', but the call was routed by group '",
          *routed_group, "' (", kRoutingGroupHeader,
          "): behind a sharding proxy one CreateModels call creates the "
          "models of one group"));
    }
  }
  return absl::OkStatus();
}

}  // namespace normd

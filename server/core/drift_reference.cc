#include "server/core/drift_reference.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/core/model.h"

namespace normd {
namespace {

// CheckChannelArray for a reference's mean and var.
absl::Status CheckMeanAndVar(const std::vector<double>& mean,
                             const std::vector<double>& var, int64_t channels,
                             absl::string_view prefix) {
  if (absl::Status s =
          CheckChannelArray(mean, channels, absl::StrCat(prefix, "mean"),
                            /*non_negative=*/false, /*empty_allowed=*/false);
      !s.ok()) {
    return s;
  }
  return CheckChannelArray(var, channels, absl::StrCat(prefix, "var"),
                           /*non_negative=*/true, /*empty_allowed=*/false);
}

}  // namespace

absl::string_view ReferenceSourceName(ReferenceSource source) {
  switch (source) {
    case ReferenceSource::kRunning:
      return "running";
    case ReferenceSource::kPooled:
      return "pooled";
    case ReferenceSource::kExplicit:
      return "explicit";
    case ReferenceSource::kCheckpoint:
      return "checkpoint";
  }
  return "unknown";
}

absl::Status ValidateReference(const DriftReference& reference,
                               int64_t channels, absl::string_view field) {
  const auto source = static_cast<int>(reference.source);
  if (source < static_cast<int>(ReferenceSource::kRunning) ||
      source > static_cast<int>(ReferenceSource::kCheckpoint)) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".source: ", source, " is not a known source"));
  }
  if (reference.set_unix_nanos < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".set_unix_nanos: must be >= 0, got ",
                     reference.set_unix_nanos));
  }
  return CheckMeanAndVar(reference.mean, reference.var, channels,
                         absl::StrCat(field, "."));
}

absl::Status ValidateReferenceRequest(const ReferenceRequest& request) {
  switch (request.source) {
    case ReferenceSource::kRunning:
    case ReferenceSource::kPooled:
      if (!request.mean.empty() || !request.var.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            request.mean.empty() ? "var" : "mean",
            ": must be empty unless source is EXPLICIT (the reference is the "
            "model's own ",
            ReferenceSourceName(request.source), " statistics)"));
      }
      return absl::OkStatus();
    case ReferenceSource::kExplicit:
      if (request.mean.empty()) {
        return absl::InvalidArgumentError(
            "mean: source EXPLICIT needs one mean per channel");
      }
      return CheckMeanAndVar(request.mean, request.var,
                             static_cast<int64_t>(request.mean.size()), "");
    case ReferenceSource::kCheckpoint:
      break;
  }
  return absl::InvalidArgumentError(
      "source: must be RUNNING, POOLED or EXPLICIT");
}

}  // namespace normd

// A BatchNorm model's drift reference: the per-channel mean and variance its
// inputs are compared against (see drift_measures.h), where they came from
// and when they were set. A plain value, part of the model's durable state.
#ifndef NORMD_SERVER_CORE_DRIFT_REFERENCE_H_
#define NORMD_SERVER_CORE_DRIFT_REFERENCE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace normd {

// Where a reference came from. The values are the wire's and the state
// files': never renumber.
enum class ReferenceSource : uint8_t {
  kRunning = 1,     // The model's running statistics when it was set.
  kPooled = 2,      // The model's exact pooled statistics when it was set.
  kExplicit = 3,    // Arrays the caller gave.
  kCheckpoint = 4,  // The running statistics of an imported checkpoint.
};

// "running", "pooled", "explicit" or "checkpoint".
absl::string_view ReferenceSourceName(ReferenceSource source);

// The statistics a model's inputs are expected to follow.
struct DriftReference {
  ReferenceSource source = ReferenceSource::kRunning;
  int64_t set_unix_nanos = 0;
  std::vector<double> mean;  // [C], finite.
  std::vector<double> var;   // [C], finite and >= 0 (biased or not: as set).
};

// INVALID_ARGUMENT naming `field` (e.g. "reference") and the array unless
// `reference` has a known source, a set time >= 0, and `channels` finite
// means and finite, non-negative variances. Allocates nothing on success.
absl::Status ValidateReference(const DriftReference& reference,
                               int64_t channels, absl::string_view field);

// What SetReference asks for: the model's running or pooled statistics as
// they are when it applies, or the given arrays (kExplicit only).
struct ReferenceRequest {
  ReferenceSource source = ReferenceSource::kRunning;
  std::vector<double> mean;
  std::vector<double> var;
};

// INVALID_ARGUMENT naming the field unless `request` can be applied to some
// model: source running, pooled or explicit; mean and var empty unless
// explicit, else of one non-zero length, finite, var >= 0. (Whether the
// length is the model's num_features is checked against the model.)
absl::Status ValidateReferenceRequest(const ReferenceRequest& request);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_DRIFT_REFERENCE_H_

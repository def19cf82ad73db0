#include "server/service/model_statistics.h"

#include "absl/time/clock.h"

namespace normd {

void ModelStatistics::Record(
    absl::string_view model, bool ok, int64_t ns, int64_t bound,
    absl::FunctionRef<bool(absl::string_view)> exists) {
  MutexLock lock(&mu_);
  if (static_cast<int64_t>(models_.size()) >= bound &&
      !models_.contains(model)) {
    absl::erase_if(models_,
                   [&](const auto& entry) { return !exists(entry.first); });
  }
  InferStatistics& stats = models_[model];
  (ok ? stats.success_count : stats.fail_count) += 1;
  (ok ? stats.success_ns : stats.fail_ns) += ns;
  stats.last_inference_ms = absl::ToUnixMillis(absl::Now());
}

InferStatistics ModelStatistics::Get(absl::string_view model) const {
  MutexLock lock(&mu_);
  auto it = models_.find(model);
  return it == models_.end() ? InferStatistics{} : it->second;
}

}  // namespace normd

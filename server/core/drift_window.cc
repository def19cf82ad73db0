#include "server/core/drift_window.h"

#include <algorithm>

namespace normd {

DriftWindow::DriftWindow(int64_t channels, int64_t buckets,
                         int64_t bucket_seconds)
    : channels_(channels),
      bucket_nanos_(std::max<int64_t>(bucket_seconds, 1) * 1'000'000'000),
      ring_(std::max<int64_t>(buckets, 1)) {}

int64_t DriftWindow::IndexAt(int64_t now_nanos) const {
  return std::max<int64_t>(now_nanos, 0) / bucket_nanos_;
}

void DriftWindow::Add(absl::Span<const Moments> moments, int64_t now_nanos) {
  const int64_t index = IndexAt(now_nanos);
  Bucket& bucket = ring_[index % static_cast<int64_t>(ring_.size())];
  if (bucket.index != index) {
    bucket.index = index;
    bucket.moments.assign(channels_, Moments{});
  }
  const size_t n = std::min(moments.size(), bucket.moments.size());
  for (size_t c = 0; c < n; ++c) MergeMoments(bucket.moments[c], moments[c]);
}

std::vector<Moments> DriftWindow::Merged(int64_t now_nanos) const {
  std::vector<Moments> total(channels_);
  const int64_t newest = IndexAt(now_nanos);
  const auto count = static_cast<int64_t>(ring_.size());
  for (int64_t index = newest - count + 1; index <= newest; ++index) {
    if (index < 0) continue;
    const Bucket& bucket = ring_[index % count];
    if (bucket.index != index) continue;
    for (int64_t c = 0; c < channels_; ++c) {
      MergeMoments(total[c], bucket.moments[c]);
    }
  }
  return total;
}

}  // namespace normd

#include "server/core/layout.h"

#include <numeric>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace normd {
namespace {

int64_t Product(absl::Span<const int64_t> dims) {
  return std::accumulate(dims.begin(), dims.end(), int64_t{1},
                         [](int64_t a, int64_t b) { return a * b; });
}

// `requested` as an axis of a rank `rank` shape (negative from the end), or
// INVALID_ARGUMENT naming channel_axis and the valid range.
absl::StatusOr<int64_t> ResolveAxis(int64_t requested, int64_t rank,
                                    int64_t first_valid) {
  const int64_t axis = requested < 0 ? requested + rank : requested;
  if (axis < 0 || axis >= rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("channel_axis: ", requested, " is out of range for rank ",
                     rank, " input (valid: ", first_valid, "..", rank - 1,
                     " or -", rank - first_valid, "..-1)"));
  }
  return axis;
}

}  // namespace

absl::StatusOr<ChannelLayout> ResolveChannelAxis(
    absl::Span<const int64_t> shape, std::optional<int32_t> channel_axis) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("input.shape: needs rank >= 2 (batch and channel), got "
                     "rank ",
                     rank));
  }
  const int64_t requested = channel_axis.value_or(1);
  absl::StatusOr<int64_t> axis = ResolveAxis(requested, rank, 1);
  if (!axis.ok()) return axis.status();
  if (*axis == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "channel_axis: ", requested, " is the batch axis 0; use 1..", rank - 1,
        " or a negative axis"));
  }
  return LayoutAround(shape, *axis);
}

ChannelLayout LayoutAround(absl::Span<const int64_t> shape, int64_t axis) {
  ChannelLayout layout;
  layout.outer = Product(shape.subspan(0, axis));
  layout.channels = shape[axis];
  layout.inner = Product(shape.subspan(axis + 1));
  return layout;
}

absl::StatusOr<int64_t> ResolveWeightNormAxis(
    absl::Span<const int64_t> shape, std::optional<int32_t> channel_axis) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank < 1) {
    return absl::InvalidArgumentError(
        "input.shape: WEIGHT_NORM needs rank >= 1, got a scalar");
  }
  return ResolveAxis(channel_axis.value_or(0), rank, 0);
}

absl::StatusOr<RowLayout> ResolveNormalizedDims(absl::Span<const int64_t> shape,
                                                int32_t normalized_ndim) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t k = normalized_ndim == 0 ? 1 : normalized_ndim;
  if (k < 0 || k > rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("normalized_ndim: ", normalized_ndim,
                     " must be in 0..rank (input rank is ", rank, ")"));
  }
  RowLayout rows;
  rows.rows = Product(shape.subspan(0, rank - k));
  rows.row_size = Product(shape.subspan(rank - k));
  return rows;
}

}  // namespace normd

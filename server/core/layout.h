// How a tensor splits around its channel axis. Plain value types.
#ifndef NORMD_SERVER_CORE_LAYOUT_H_
#define NORMD_SERVER_CORE_LAYOUT_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace normd {

// A row-major tensor seen as [outer, channels, inner]: outer is the product of
// the dims before the channel axis, inner of those after it. NCHW is
// [N, C, H*W]; channels-last (axis -1) is [N*H*W, C, 1].
struct ChannelLayout {
  int64_t outer = 0;
  int64_t channels = 0;
  int64_t inner = 0;

  // Values per channel (m in docs/api.md).
  int64_t PerChannel() const { return outer * inner; }
  int64_t NumElements() const { return outer * channels * inner; }
  // The channel of the element at flat index `element`.
  int64_t ChannelOf(int64_t element) const {
    return element / inner % channels;
  }
};

// Channels [c0, c1) over rows (outer indices) [r0, r1) of a ChannelLayout.
struct ChannelRowBlock {
  int64_t c0 = 0, c1 = 0, r0 = 0, r1 = 0;
  int64_t width() const { return c1 - c0; }
};

// Resolves the BatchNorm channel axis of `shape`: unset = 1, negative counts
// from the end. INVALID_ARGUMENT (naming `channel_axis` / `input.shape`) for a
// rank below 2, an axis out of range, or the batch axis 0.
absl::StatusOr<ChannelLayout> ResolveChannelAxis(
    absl::Span<const int64_t> shape, std::optional<int32_t> channel_axis);

// Resolves the WEIGHT_NORM axis (PyTorch's `dim`) of `shape` to an index:
// unset = 0, negative counts from the end, any axis of a rank >= 1 shape.
// INVALID_ARGUMENT naming `input.shape` / `channel_axis` otherwise.
absl::StatusOr<int64_t> ResolveWeightNormAxis(
    absl::Span<const int64_t> shape, std::optional<int32_t> channel_axis);

// `shape` split around its axis `axis` (0 <= axis < rank): WEIGHT_NORM's
// norm is taken per channel, over every other axis.
ChannelLayout LayoutAround(absl::Span<const int64_t> shape, int64_t axis);

// The rows of LayerNorm: `rows` rows of `row_size` elements (the last
// normalized_ndim dims).
struct RowLayout {
  int64_t rows = 0;
  int64_t row_size = 0;
};

// Resolves LayerNorm rows; normalized_ndim 0 means 1. INVALID_ARGUMENT (naming
// `normalized_ndim`) when it is negative or exceeds the rank.
absl::StatusOr<RowLayout> ResolveNormalizedDims(absl::Span<const int64_t> shape,
                                                int32_t normalized_ndim);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_LAYOUT_H_

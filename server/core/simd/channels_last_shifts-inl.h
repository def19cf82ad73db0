// The shifts of ChannelsLastSums (channel_moments.cc): each channel's
// sample mean, or the shift hint its tile takes. Include in files compiled
// per target, after hwy/highway.h. Pure functions.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_SHIFTS_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_SHIFTS_INL_H_
#undef NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_SHIFTS_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_SHIFTS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "server/core/simd/channels_last_write-inl.h"
#include "server/core/simd/fold.h"
#include "server/core/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The rows whose mean is a channel's shift, and those that decide on a
// tile's shift hints.
inline constexpr int64_t kTileShiftSample = 32;
inline constexpr int64_t kTileHintSample = 128;

// The shifts of `count` channels-last channels from `c`: the fp32 mean of
// each one's first kTileShiftSample rows from r0 (an overflow gives a
// non-finite shift, which NeedsExactPath catches).
template <DType kType, typename Stored>
HWY_INLINE void Shifts(const Stored* HWY_RESTRICT x, int64_t stride, int64_t c,
                       int64_t count, int64_t r0, int64_t r1,
                       float* HWY_RESTRICT center) {
  using E = Elements<kType>;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t sample_end = std::min(r1, r0 + kTileShiftSample);
  const float inverse = 1.0f / static_cast<float>(sample_end - r0);
  const int64_t whole = count - count % lanes;
  for (int64_t j = 0; j < whole; j += lanes) {
    auto sum = hn::Zero(d);
    for (int64_t r = r0; r < sample_end; ++r) {
      sum = hn::Add(sum, E::Load(d, x + r * stride + c + j));
    }
    hn::StoreU(hn::Mul(sum, hn::Set(d, inverse)), d, center + j);
  }
  for (int64_t j = whole; j < count; ++j) {
    float sum = 0.0f;
    for (int64_t r = r0; r < sample_end; ++r) {
      sum += E::Scalar(x[r * stride + c + j]);
    }
    center[j] = sum * inverse;
  }
}

// Takes each tile's shift hints (channel j's at hints[j], j < count, a
// multiple of kTile) into center, which holds the channels' sample means
// (Shifts), where every channel of the tile fits (fold::HintFits, the same
// rule in fp32 lanes, over its first kTileHintSample rows). True when every
// tile took them.
template <DType kType, typename Stored>
HWY_INLINE bool TakeHints(const Stored* HWY_RESTRICT x, int64_t stride,
                          int64_t c, int64_t count, int64_t r0, int64_t r1,
                          const float* HWY_RESTRICT hints,
                          float* HWY_RESTRICT center) {
  using E = Elements<kType>;
  const FloatVectorTag d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const int64_t sample_end = std::min(r1, r0 + kTileHintSample);
  const auto rows = hn::Set(d, static_cast<float>(sample_end - r0));
  const auto limit = hn::Set(d, static_cast<float>(fold::kMaxHintOffset2));
  bool all = true;
  for (int64_t t = 0; t < count; t += kTile) {
    bool fits = true;
    for (int64_t j = t; j < t + kTile; j += lanes) {
      // The sample's sums about the mean of its first rows.
      const auto shift = hn::LoadU(d, center + j);
      auto sum = hn::Zero(d);
      auto squares = hn::Zero(d);
      for (int64_t r = r0; r < sample_end; ++r) {
        const auto e = hn::Sub(E::Load(d, x + r * stride + c + j), shift);
        sum = hn::Add(sum, e);
        squares = hn::Add(squares, hn::Mul(e, e));
      }
      const auto mean = hn::Div(sum, rows);
      const auto offset =
          hn::Sub(hn::Sub(hn::LoadU(d, hints + j), shift), mean);
      const auto m2 = hn::Sub(squares, hn::Mul(sum, mean));
      const auto fit = hn::Or(
          hn::Eq(m2, hn::Zero(d)),
          hn::Le(hn::Mul(hn::Mul(offset, offset), rows), hn::Mul(limit, m2)));
      fits = fits && hn::AllTrue(d, fit);
    }
    if (fits) {
      std::copy_n(hints + t, kTile, center + t);
    } else {
      all = false;
    }
  }
  return all;
}

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_SHIFTS_INL_H_

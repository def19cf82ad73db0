// ChannelsLastSums' writes (channel_moments.cc): nothing, or the channel
// affine of each vector it reads, and the width of its tiles. Include in
// files compiled per target, after hwy/highway.h.

// Per-target include guard: toggled for each pass of foreach_target.h.
#if defined(NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_WRITE_INL_H_) == \
    defined(HWY_TARGET_TOGGLE)
#ifdef NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_WRITE_INL_H_
#undef NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_WRITE_INL_H_
#else
#define NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_WRITE_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/highway.h"
#include "server/core/simd/affine_store-inl.h"
#include "server/core/simd/half-inl.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The channels of a whole channels-last tile: its lanes (see
// channel_moments.h).
inline constexpr int64_t kTile = 64;

// ChannelsLastSums' `write` of nothing. Every write says whether it writes
// (kWrites) and whether whole bfloat16 tiles may be read for it in pair
// order (kPairOrder: its constants, if any, are in pair order too). Its
// Store<kDeviations>(row, c, v, place) gets vector v of channels from c of
// row `row`, its place in the panel, and with kDeviations v is already x -
// a (the pass shifted its moments by the write's own a).
struct NoRowWrite {
  static constexpr bool kWrites = false;
  static constexpr bool kPairOrder = true;
  static constexpr bool kOneTile = false;  // Writes any width (see Tile).
  template <bool kDeviations, class V>
  HWY_INLINE void Store(int64_t /*row*/, int64_t /*c*/, V /*values*/,
                        int /*place*/) const {}
};

// ChannelsLastSums' `write` of the channel affine (ChannelAffineWrite's,
// the same bits but for NaNs with kUnchecked) of each vector it reads:
// channel c's value of row r to y[r * stride + c], fma(x - a[c], b[c],
// c[c]) in fp32 narrowed to kType (NaNs as kNaNs), streamed with kStream
// (every row aligned to 64 bytes) or stored. One thread's: it holds an even
// vector's result until the odd one's call.
template <DType kType, bool kStream, NaNs kNaNs = NaNs::kCanonical>
struct ChannelsLastAffineWrite {
  static constexpr bool kWrites = true;
  static constexpr bool kPairOrder = false;
  static constexpr bool kOneTile = false;
  typename Elements<kType>::Stored* HWY_RESTRICT y;
  int64_t stride;
  const float* a;
  const float* b;
  const float* c;
  alignas(64) mutable float held[hn::MaxLanes(FloatVectorTag())];

  template <bool kDeviations, class V>
  HWY_INLINE void Store(int64_t row, int64_t channel, V values,
                        int place) const {
    const FloatVectorTag d;
    StorePanelAffine<kType, kStream, false, kDeviations, kNaNs>(
        d, place, values, kDeviations ? values : hn::LoadU(d, a + channel),
        hn::LoadU(d, b + channel), hn::LoadU(d, c + channel),
        y + row * stride + channel, held);
  }

  // The same write for one tile of kTile channels from `first`, from the
  // writer's own copy of the tile's constants (in pair order where bfloat16
  // tiles are read so). ChannelsLastSums works from a local copy of its
  // writer: a vector store may alias any object whose address the compiler
  // has seen, so it would reload a caller's members for every vector.
  // ChannelsLastSums takes its width as the constant kTile (kOneTile), so
  // that its copy for this writer is compiled for that width alone.
  struct Tile {
    static constexpr bool kWrites = true;
    static constexpr bool kPairOrder =
        kType == DType::kBFloat16 && HWY_TARGET != HWY_SCALAR;
    static constexpr bool kOneTile = true;  // Writes kTile channels only.
    typename Elements<kType>::Stored* HWY_RESTRICT y;
    int64_t stride;
    int64_t first;
    alignas(64) float a[kTile];
    alignas(64) float b[kTile];
    alignas(64) float c[kTile];
    alignas(64) mutable float held[hn::MaxLanes(FloatVectorTag())];

    template <bool kDeviations, class V>
    HWY_INLINE void Store(int64_t row, int64_t channel, V values,
                          int place) const {
      const FloatVectorTag d;
      const int64_t at = channel - first;
      StorePanelAffine<kType, kStream, kPairOrder, kDeviations, kNaNs>(
          d, place, values, kDeviations ? values : hn::Load(d, a + at),
          hn::Load(d, b + at), hn::Load(d, c + at), y + row * stride + channel,
          held);
    }
  };
  void CopyTile(int64_t first, Tile& tile) const {
    tile.y = y;
    tile.stride = stride;
    tile.first = first;
    std::copy_n(a + first, kTile, tile.a);
    std::copy_n(b + first, kTile, tile.b);
    std::copy_n(c + first, kTile, tile.c);
    if constexpr (Tile::kPairOrder) {
      const int64_t lanes = static_cast<int64_t>(hn::Lanes(FloatVectorTag()));
      PairOrder(tile.a, kTile, lanes, /*back=*/false);
      PairOrder(tile.b, kTile, lanes, /*back=*/false);
      PairOrder(tile.c, kTile, lanes, /*back=*/false);
    }
  }
};

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#endif  // NORMD_SERVER_CORE_SIMD_CHANNELS_LAST_WRITE_INL_H_

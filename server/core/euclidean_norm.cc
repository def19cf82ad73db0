#include "server/core/euclidean_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/core/half.h"

namespace normd {
namespace {

// Below this, a sum of squares may hold squares that lost bits to fp64's
// underflow (each square under 2^-1022 is, and n of them are negligible
// beside a sum this large): such sums, zero included, are scanned.
constexpr double kMinExactSumOfSquares = 1e-250;

// Element i of x, of `dtype`, as a double (exact).
double Load(DType dtype, const void* x, int64_t i) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(x)[i];
    case DType::kFloat64:
      return static_cast<const double*>(x)[i];
    case DType::kBFloat16:
    case DType::kFloat16:
      break;
  }
  return HalfToFloat(dtype, static_cast<const uint16_t*>(x)[i]);
}

// Calls f(value) for every value of channel `channel`, in memory order.
template <typename F>
void ForEachValue(DType dtype, const void* x, const ChannelLayout& layout,
                  int64_t channel, const F& f) {
  for (int64_t o = 0; o < layout.outer; ++o) {
    const int64_t base = (o * layout.channels + channel) * layout.inner;
    for (int64_t i = 0; i < layout.inner; ++i) f(Load(dtype, x, base + i));
  }
}

}  // namespace

double ScannedEuclideanNorm(DType dtype, const void* x,
                            const ChannelLayout& layout, int64_t channel) {
  double largest = 0.0;
  bool nan = false;
  ForEachValue(dtype, x, layout, channel, [&](double v) {
    nan |= std::isnan(v);
    largest = std::max(largest, std::abs(v));
  });
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (largest == 0.0 || std::isinf(largest)) return largest;
  double sum = 0.0;  // Of (v / largest)^2, each in [0, 1].
  ForEachValue(dtype, x, layout, channel, [&](double v) {
    const double scaled = v / largest;
    sum += scaled * scaled;
  });
  return largest * std::sqrt(sum);
}

double EuclideanNorm(const Moments& moments, DType dtype, const void* x,
                     const ChannelLayout& layout, int64_t channel) {
  const double squares = moments.m2 + static_cast<double>(moments.count) *
                                          moments.mean * moments.mean;
  // Written so that NaN takes the scan too.
  if (squares >= kMinExactSumOfSquares &&
      squares <= std::numeric_limits<double>::max()) {
    return std::sqrt(squares);
  }
  return ScannedEuclideanNorm(dtype, x, layout, channel);
}

}  // namespace normd

// Straightforward fp64 (long double accumulation) reference implementations of
// what normd computes, written independently of the core's blocked kernels.
// Test-only; single-threaded.
#ifndef NORMD_TESTS_TESTING_REFERENCE_H_
#define NORMD_TESTS_TESTING_REFERENCE_H_

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace normd::testing {

// The bit pattern of a float or double, for comparisons that NaN payloads
// and signed zeros must not pass.
template <typename T>
uint64_t Bits(T v) {
  if constexpr (sizeof(T) == 4) {
    return std::bit_cast<uint32_t>(v);
  } else {
    return std::bit_cast<uint64_t>(v);
  }
}

// Per-channel mean and biased variance, two passes in long double.
struct RefStats {
  std::vector<double> mean;
  std::vector<double> var;  // Biased.
};

// x laid out as [outer, channels, inner].
template <typename T>
RefStats ReferenceChannelStats(const std::vector<T>& x, int64_t outer,
                               int64_t channels, int64_t inner) {
  std::vector<long double> sum(channels, 0.0L);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i)
        sum[c] += x[(o * channels + c) * inner + i];
  const long double m = static_cast<long double>(outer * inner);
  std::vector<long double> mean(channels);
  for (int64_t c = 0; c < channels; ++c) mean[c] = sum[c] / m;
  std::vector<long double> sq(channels, 0.0L);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const long double d = x[(o * channels + c) * inner + i] - mean[c];
        sq[c] += d * d;
      }
  RefStats out;
  for (int64_t c = 0; c < channels; ++c) {
    out.mean.push_back(static_cast<double>(mean[c]));
    out.var.push_back(static_cast<double>(sq[c] / m));
  }
  return out;
}

// PyTorch's running statistics (from mean 0 / var 1) after one training step
// per batch, in order; each batch is [rows, channels] row-major. Batches of a
// single row do not update them (PyTorch needs an unbiased variance).
struct RunningStats {
  std::vector<double> mean;
  std::vector<double> var;
};
inline RunningStats ReferenceRunningStats(
    const std::vector<std::vector<double>>& batches, int64_t rows,
    int64_t channels, double momentum) {
  RunningStats out{std::vector<double>(channels, 0.0),
                   std::vector<double>(channels, 1.0)};
  if (rows < 2) return out;
  for (const std::vector<double>& batch : batches) {
    const RefStats s = ReferenceChannelStats(batch, rows, channels, 1);
    for (int64_t c = 0; c < channels; ++c) {
      const double unbiased = s.var[c] * rows / (rows - 1);
      out.mean[c] = (1 - momentum) * out.mean[c] + momentum * s.mean[c];
      out.var[c] = (1 - momentum) * out.var[c] + momentum * unbiased;
    }
  }
  return out;
}

// y = (x - mean[c]) / sqrt(var[c] + eps) * w[c] + b[c], in long double.
template <typename T>
std::vector<double> ReferenceChannelNormalize(
    const std::vector<T>& x, int64_t outer, int64_t channels, int64_t inner,
    const std::vector<double>& mean, const std::vector<double>& var, double eps,
    const std::vector<double>& w, const std::vector<double>& b) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t k = (o * channels + c) * inner + i;
        const long double v =
            (static_cast<long double>(x[k]) - mean[c]) /
                std::sqrt(static_cast<long double>(var[c]) + eps) * w[c] +
            b[c];
        y[k] = static_cast<double>(v);
      }
  return y;
}

// LayerNorm over rows of n: rows = x.size() / n. Empty w / b = none.
template <typename T>
std::vector<double> ReferenceLayerNorm(const std::vector<T>& x, int64_t n,
                                       double eps, const std::vector<double>& w,
                                       const std::vector<double>& b) {
  const int64_t rows = static_cast<int64_t>(x.size()) / n;
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    const RefStats s = ReferenceChannelStats(
        std::vector<T>(x.begin() + r * n, x.begin() + (r + 1) * n), 1, 1, n);
    const long double rstd =
        1.0L / std::sqrt(static_cast<long double>(s.var[0]) + eps);
    for (int64_t j = 0; j < n; ++j) {
      long double v =
          (static_cast<long double>(x[r * n + j]) - s.mean[0]) * rstd;
      if (!w.empty()) v *= w[j];
      if (!b.empty()) v += b[j];
      y[r * n + j] = static_cast<double>(v);
    }
  }
  return y;
}

// GroupNorm (InstanceNorm: groups = C) of x with shape `shape`, channel axis
// `axis` (>= 1), straight from the definition: element k of sample n and
// channel c belongs to set (n, c / (C / groups)); two passes in long double
// per set. `mean` / `var` (biased) receive the per-set statistics. Empty w /
// b = none.
template <typename T>
std::vector<double> ReferenceGroupNorm(const std::vector<T>& x,
                                       const std::vector<int64_t>& shape,
                                       int axis, int64_t groups, double eps,
                                       const std::vector<double>& w,
                                       const std::vector<double>& b,
                                       std::vector<double>* mean = nullptr,
                                       std::vector<double>* var = nullptr) {
  int64_t inner = 1;
  for (size_t d = axis + 1; d < shape.size(); ++d) inner *= shape[d];
  const int64_t channels = shape[axis];
  const int64_t samples = shape[0];
  const int64_t sample_size = static_cast<int64_t>(x.size()) / samples;
  const int64_t per_group = channels / groups;
  auto set_of = [&](int64_t k) {
    const int64_t c = (k / inner) % channels;
    return (k / sample_size) * groups + c / per_group;
  };
  std::vector<long double> sum(samples * groups, 0), m2(samples * groups, 0);
  std::vector<int64_t> count(samples * groups, 0);
  for (size_t k = 0; k < x.size(); ++k) {
    sum[set_of(k)] += x[k];
    count[set_of(k)] += 1;
  }
  std::vector<long double> mu(sum.size());
  for (size_t g = 0; g < sum.size(); ++g) mu[g] = sum[g] / count[g];
  for (size_t k = 0; k < x.size(); ++k) {
    const long double d = x[k] - mu[set_of(k)];
    m2[set_of(k)] += d * d;
  }
  if (mean != nullptr) mean->assign(mu.begin(), mu.end());
  if (var != nullptr) {
    var->resize(sum.size());
    for (size_t g = 0; g < sum.size(); ++g) (*var)[g] = m2[g] / count[g];
  }
  std::vector<double> y(x.size());
  for (size_t k = 0; k < x.size(); ++k) {
    const int64_t g = set_of(k);
    const int64_t c = (k / inner) % channels;
    long double v = (x[k] - mu[g]) / std::sqrt(m2[g] / count[g] + eps);
    if (!w.empty()) v *= w[c];
    if (!b.empty()) v += b[c];
    y[k] = static_cast<double>(v);
  }
  return y;
}

// RMSNorm over rows of n: y = x / sqrt(mean(x^2) + eps) * w + b, in long
// double. Empty w / b = none.
template <typename T>
std::vector<double> ReferenceRmsNorm(const std::vector<T>& x, int64_t n,
                                     double eps, const std::vector<double>& w,
                                     const std::vector<double>& b) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    long double squares = 0;
    for (int64_t j = 0; j < n; ++j) {
      squares += static_cast<long double>(x[r * n + j]) * x[r * n + j];
    }
    const long double rms = std::sqrt(squares / n + eps);
    for (int64_t j = 0; j < n; ++j) {
      long double v = x[r * n + j] / rms;
      if (!w.empty()) v *= w[j];
      if (!b.empty()) v += b[j];
      y[r * n + j] = static_cast<double>(v);
    }
  }
  return y;
}

// torch.nn.functional.normalize(p=2) of rows of n values: x / max(||x||,
// eps), the squares summed in long double (whose range holds the squares
// of any double).
template <typename T>
std::vector<double> ReferenceL2Norm(const std::vector<T>& x, int64_t n,
                                    double eps) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / n; ++r) {
    long double squares = 0;
    for (int64_t j = 0; j < n; ++j) {
      squares += static_cast<long double>(x[r * n + j]) * x[r * n + j];
    }
    const long double norm = std::max<long double>(std::sqrt(squares), eps);
    for (int64_t j = 0; j < n; ++j) {
      y[r * n + j] = static_cast<double>(x[r * n + j] / norm);
    }
  }
  return y;
}

// torch.nn.utils.weight_norm of v laid out as [outer, channels, inner]
// around its `dim`: g[c] * v / ||v[channel c]||; g empty: g = the norms.
template <typename T>
std::vector<double> ReferenceWeightNorm(const std::vector<T>& v, int64_t outer,
                                        int64_t channels, int64_t inner,
                                        const std::vector<double>& g) {
  std::vector<long double> squares(channels, 0.0L);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c)
      for (int64_t i = 0; i < inner; ++i) {
        const long double x = v[(o * channels + c) * inner + i];
        squares[c] += x * x;
      }
  std::vector<double> y(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t c = 0; c < channels; ++c) {
      const long double norm = std::sqrt(squares[c]);
      const long double gain = g.empty() ? norm : g[c];
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t at = (o * channels + c) * inner + i;
        y[at] = static_cast<double>(gain * (v[at] / norm));
      }
    }
  return y;
}

template <typename T>
std::vector<T> RandomValues(int64_t n, uint32_t seed, double offset = 0.0,
                            double scale = 1.0) {
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> dist(offset, scale);
  std::vector<T> out(n);
  for (auto& v : out) v = static_cast<T>(dist(gen));
  return out;
}

// Unit roundoffs: half an ulp of 1.
inline constexpr double kU32 = 0x1p-24;
inline constexpr double kU64 = 0x1p-53;

// The largest error a normalized output y of normd may have against the
// long-double reference, from the error analysis of the row kernels:
// - fp32: moments over at most 16 fp32 terms per lane before an fp64 flush,
//   the mean kept as hi + lo so that x - mean is exact near it: the variance
//   is within 17 u, the scale within 9 u, the mean within 16 u of sigma, and
//   the affine rounds up to 6 times: 32 u (|y - b| + |w|) + u |y|, which
//   with |w| <= 2 is at most 64 ulps of max(1, |y|) where the tests use it;
// - fp64: exact two-pass moments in 8 fp64 lanes of at most `lane_terms`
//   terms each: the mean is within lane_terms u max|x|, which moves y by
//   lane_terms u kappa |w| (kappa = max|x| / sigma), and the variance's
//   squares and sums add (lane_terms + 8) u |y - b|.
// A dropped eps (eps / 2 sigma^2 relative) or an fp64 value narrowed to
// fp32 (2^-24 relative) errs far past the fp64 bound.
inline double Fp32OutputBound(double y, double b, double w) {
  return 32 * kU32 * (std::abs(y - b) + std::abs(w)) + kU32 * std::abs(y);
}
inline double Fp64OutputBound(double y, double b, double w, int64_t lane_terms,
                              double kappa) {
  const double n = static_cast<double>(lane_terms);
  return kU64 * (n * kappa * std::abs(w) + (n + 8) * std::abs(y - b) +
                 std::abs(y) + 1);
}

// |a - b| / max(|b|, floor).
inline double RelErr(double a, double b, double floor = 1e-30) {
  return std::abs(a - b) / std::max(std::abs(b), floor);
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_REFERENCE_H_

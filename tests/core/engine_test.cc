// The engine's paths agree bit for bit: streamed vs cached outputs,
// scattered vs contiguous input, 1 vs N threads, serial loops.
#include "server/core/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "server/core/parallel.h"
#include "server/core/simd/streaming.h"
#include "server/core/thread_paths.h"
#include "tests/testing/core_cases.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::Fp32OutputBound;
using ::normd::testing::GroupCase;
using ::normd::testing::NumElementsOf;
using ::normd::testing::RandomValues;
using ::normd::testing::ReferenceChannelStats;
using ::normd::testing::ReferenceLayerNorm;
using ::normd::testing::ReferenceRmsNorm;
using ::normd::testing::TrainingSpec;
using ::normd::testing::View;

// Every fp32 channel path (AVX-512 runs, short runs, channels-last
// registers and per-element loads, with streaming or ordinary stores, and
// the compiled loops that CPUs without AVX-512 run: this test is also run
// with NORMD_SIMD_TARGET=avx2) computes exactly the documented formula: hi =
// the fp64 mean rounded to float, y = fma(x - hi, float(scale), float(shift -
// (mean - hi) * scale)) with scale = weight / sqrt(var + eps) in fp64.
// BatchNorm eval with a model whose statistics the test chose, means off
// float's grid.
TEST(StreamingTest, ChannelOutputsAreTheDocumentedFp32FormulaBitwise) {
  struct Case {
    Shape shape;
    int32_t axis;
  };
  const Case cases[] = {
      {{4, 6, 40, 50}, 1},    // Runs of 2000.
      {{40, 6, 7, 7}, 1},     // Short runs (49 values).
      {{4, 50, 41, 64}, -1},  // Channels-last, parameters in registers.
      {{4, 50, 41, 5}, -1},   // Channels-last, per-element parameters.
      {{4, 50, 41, 80}, -1},
  };
  for (const Case& c : cases) {
    const int64_t channels = c.axis < 0 ? c.shape.back() : c.shape[1];
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<float>(n, 31, 1e4, 3.0);
    ModelSpec create;
    create.name = "m";
    create.num_features = channels;
    for (int64_t k = 0; k < channels; ++k) {
      const double i = static_cast<double>(k);
      create.running_mean.push_back(1e4 + i / 3.0);
      create.running_var.push_back(2.0 + i / 7.0);
      create.weight.push_back(0.5 + i / 11.0);
      create.bias.push_back(0.25 - i / 13.0);
    }
    std::vector<float> expected(n);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t k = c.axis < 0
                            ? i % channels
                            : (i / (n / c.shape[0] / channels)) % channels;
      const double mean = create.running_mean[k];
      const double scale =
          create.weight[k] / std::sqrt(create.running_var[k] + kDefaultEps);
      const float hi = static_cast<float>(mean);
      const float shift = static_cast<float>(
          create.bias[k] - (mean - static_cast<double>(hi)) * scale);
      expected[i] = std::fma(x[i] - hi, static_cast<float>(scale), shift);
    }
    for (int64_t threshold :
         {std::numeric_limits<int64_t>::max(), int64_t{0}}) {
      SCOPED_TRACE(::testing::Message()
                   << "last dim " << c.shape.back() << " axis " << c.axis
                   << " streamed " << (threshold == 0));
      SetStreamingOutputBytes(threshold);
      Engine engine;
      ASSERT_TRUE(engine.store().Create(create).ok());
      NormalizeSpec spec;
      spec.mode = NormMode::kBatchNorm;
      spec.model = "m";
      spec.input = View(x, c.shape);
      spec.channel_axis = c.axis;
      std::vector<float> y(n);
      ASSERT_TRUE(engine.Normalize(spec, y.data()).ok());
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (std::memcmp(&y[i], &expected[i], sizeof(float)) != 0 &&
            differ++ < 3) {
          ADD_FAILURE() << "element " << i << ": " << y[i] << " expected "
                        << expected[i];
        }
      }
      EXPECT_EQ(differ, 0);
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

// Large outputs go out through streaming stores (fused AVX-512 runs or a
// staging buffer); they must carry exactly the bits of the cached path.
TEST(StreamingTest, StreamedOutputsEqualCachedOutputsBitwise) {
  struct Case {
    NormMode mode;
    Shape shape;
    int32_t axis_or_k;
    bool affine;
    int64_t groups = 0;  // GroupNorm.
  };
  const Case cases[] = {
      {NormMode::kLayerNorm, {4096, 768}, 1, true},
      {NormMode::kLayerNorm, {2, 1, 40000}, 1, false},  // Long rows.
      // Enough long rows for whole rows per work item.
      {NormMode::kLayerNorm, {16, 40000}, 1, true},
      {NormMode::kBatchNorm, {8, 16, 128, 128}, 1, true},
      {NormMode::kBatchNorm, {8, 128, 128, 16}, -1, false},
      // Odd row lengths and channel counts: rows and channel periods that
      // start mid-line, a period longer than 1024 (C = 1500).
      {NormMode::kLayerNorm, {4099, 771}, 1, true},
      {NormMode::kBatchNorm, {8, 128, 128, 3}, -1, true},
      {NormMode::kBatchNorm, {1500, 1500}, 1, true},
      // Channels-last counts whose parameters repeat within 64 values (held
      // in registers: 1, 2, 3 or 4 vectors), ones that do not (5, 80), and a
      // period shorter than the repeat (6 channels, 6 rows: 36 < 48).
      {NormMode::kBatchNorm, {4, 100, 99, 64}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 24}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 32}, -1, false},
      {NormMode::kBatchNorm, {4, 100, 99, 1}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 5}, -1, true},
      {NormMode::kBatchNorm, {4, 100, 99, 80}, -1, true},
      {NormMode::kBatchNorm, {6, 6}, -1, true},
      // Runs of 16-255 values (7x7, 5x5, 4x4 images) go line by line across
      // runs, a line's lanes from up to two channels.
      {NormMode::kBatchNorm, {64, 32, 7, 7}, 1, true},
      {NormMode::kBatchNorm, {50, 20, 5, 5}, 1, false},
      {NormMode::kBatchNorm, {30, 8, 4, 4}, 1, true},
      {NormMode::kBatchNorm, {20, 12, 15, 17}, 1, true},
      {NormMode::kBatchNorm, {7, 3, 16, 16}, 1, true},
      {NormMode::kGroupNorm, {4, 60, 61, 64}, -1, true, 8},
      {NormMode::kGroupNorm, {4, 60, 61, 48}, -1, false, 4},
      {NormMode::kInstanceNorm, {4, 60, 61, 64}, -1, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message()
                 << "mode " << static_cast<int>(c.mode) << " last dim "
                 << c.shape.back() << " axis/k " << c.axis_or_k);
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    const auto x = RandomValues<float>(n, 5, 100.0, 3.0);
    // `offset` floats into the buffer: 1 makes every line partial at the
    // ends (masked stores).
    auto run = [&](int64_t threshold, int64_t offset) {
      SetStreamingOutputBytes(threshold);
      Engine engine;
      NormalizeSpec spec = TrainingSpec("s", x, c.shape, c.axis_or_k);
      spec.mode = c.mode;
      spec.normalized_ndim = c.axis_or_k;
      spec.num_groups = c.groups;
      if (c.mode != NormMode::kBatchNorm) spec.model.clear();  // Stateless.
      const int64_t params = c.mode == NormMode::kLayerNorm || c.axis_or_k < 0
                                 ? c.shape.back()
                                 : c.shape[1];
      if (c.affine) {
        std::vector<double> w(params), b(params);
        for (int64_t i = 0; i < params; ++i) {
          w[i] = 0.5 + 0.001 * static_cast<double>(i);
          b[i] = 0.25 - 0.002 * static_cast<double>(i);
        }
        spec.weight = AffineParam{{params}, w};
        spec.bias = AffineParam{{params}, b};
      }
      std::vector<float> y(n + offset);
      EXPECT_TRUE(engine.Normalize(spec, y.data() + offset).ok());
      return std::vector<float>(y.begin() + offset, y.end());
    };
    const auto cached = run(std::numeric_limits<int64_t>::max(), 0);
    for (int64_t offset : {0, 1}) {
      const auto streamed = run(0, offset);
      EXPECT_EQ(std::memcmp(streamed.data(), cached.data(), n * sizeof(float)),
                0)
          << "output offset " << offset;
    }
    SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
  }
}

// Rows of 16-256 values stream sixteen at a time (into a 64-byte aligned
// output, as the service's), with the bits of the cached path and of a
// misaligned output (a row at a time), in every row style, with and without
// weights and biases, and against the fp64 definitions.
TEST(StreamingTest, ShortRowsStreamedInBatchesEqualCachedBitwise) {
  using ::normd::testing::ReferenceRmsNorm;
  for (int64_t n : {16, 48, 64, 128, 100, 200, 256}) {
    constexpr int64_t kRows = 1000;  // 62 batches and 8 rows.
    const auto x = RandomValues<float>(kRows * n, 21 + n, 2.0, 3.0);
    std::vector<double> w(n), b(n);
    for (int64_t j = 0; j < n; ++j) {
      w[j] = 0.5 + 0.01 * static_cast<double>(j);
      b[j] = 0.25 - 0.02 * static_cast<double>(j);
    }
    for (LayerNormStyle style :
         {LayerNormStyle::kPyTorch, LayerNormStyle::kBertUnbiasedStd,
          LayerNormStyle::kRms}) {
      for (int affine = 0; affine < 3; ++affine) {
        SCOPED_TRACE(::testing::Message()
                     << "n " << n << " style " << static_cast<int>(style)
                     << " affine " << affine);
        NormalizeSpec spec;
        spec.mode = style == LayerNormStyle::kRms ? NormMode::kRmsNorm
                                                  : NormMode::kLayerNorm;
        spec.layer_norm_style =
            style == LayerNormStyle::kRms ? LayerNormStyle::kPyTorch : style;
        spec.normalized_ndim = 1;
        spec.input = View(x, {kRows, n});
        if (affine >= 1) spec.weight = AffineParam{{n}, w};
        if (affine >= 2) spec.bias = AffineParam{{n}, b};
        // offset -1: in place, in an aligned copy of x.
        auto run = [&](int64_t threshold, int64_t offset) {
          SetStreamingOutputBytes(threshold);
          std::vector<float> buffer(kRows * n + 32);
          const auto address = reinterpret_cast<uintptr_t>(buffer.data());
          float* y = buffer.data() + (64 - address % 64) % 64 / 4 +
                     std::max<int64_t>(offset, 0);
          NormalizeSpec call = spec;
          if (offset < 0) {
            std::copy(x.begin(), x.end(), y);
            call.input.data = y;
          }
          Engine engine;
          EXPECT_TRUE(engine.Normalize(call, y).ok());
          SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
          return std::vector<float>(y, y + kRows * n);
        };
        const auto cached = run(std::numeric_limits<int64_t>::max(), 0);
        for (int64_t offset : {0, 1, -1}) {
          const auto streamed = run(0, offset);
          EXPECT_EQ(std::memcmp(streamed.data(), cached.data(),
                                cached.size() * sizeof(float)),
                    0)
              << "output offset " << offset;
        }
        const std::vector<double> no;
        const auto& weight = affine >= 1 ? w : no;
        const auto& bias = affine >= 2 ? b : no;
        std::vector<double> ref;
        if (style == LayerNormStyle::kRms) {
          ref = ReferenceRmsNorm(x, n, 1e-5, weight, bias);
        } else if (style == LayerNormStyle::kPyTorch) {
          ref = ReferenceLayerNorm(x, n, 1e-5, weight, bias);
        } else {
          // (x - mean) / (unbiased std + 1e-6), from the fp64 statistics.
          ref.resize(x.size());
          for (int64_t r = 0; r < kRows; ++r) {
            const auto s = ReferenceChannelStats(
                std::vector<float>(x.begin() + r * n, x.begin() + (r + 1) * n),
                1, 1, n);
            const double std_unbiased = std::sqrt(
                s.var[0] * static_cast<double>(n) / static_cast<double>(n - 1));
            for (int64_t j = 0; j < n; ++j) {
              double v = (x[r * n + j] - s.mean[0]) / (std_unbiased + 1e-6);
              if (affine >= 1) v *= w[j];
              if (affine >= 2) v += b[j];
              ref[r * n + j] = v;
            }
          }
        }
        // reference.h's Fp32OutputBound, element by element (BERT's scale
        // 1 / (std + eps) rounds as few times as PyTorch's).
        int bad = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
          const int64_t j = static_cast<int64_t>(i) % n;
          const double bound = Fp32OutputBound(ref[i], affine >= 2 ? b[j] : 0.0,
                                               affine >= 1 ? w[j] : 1.0);
          if (!(std::abs(cached[i] - ref[i]) <= bound) && ++bad <= 3) {
            ADD_FAILURE() << "element " << i << ": " << cached[i] << " vs "
                          << ref[i] << " (bound " << bound << ")";
          }
        }
      }
    }
  }
}

// The bytes of x split at random boundaries (1 byte to 2 KiB, so elements
// straddle chunks and most chunks are misaligned), copied into odd offsets of
// one backing string.
class RandomChunks {
 public:
  template <typename T>
  RandomChunks(const std::vector<T>& x, uint32_t seed) {
    const char* bytes = reinterpret_cast<const char*>(x.data());
    const size_t n = x.size() * sizeof(T);
    std::mt19937 gen(seed);
    std::vector<std::pair<size_t, size_t>> cuts;  // (backing offset, size)
    for (size_t pos = 0; pos < n;) {
      const size_t take = std::min<size_t>(
          n - pos, std::uniform_int_distribution<size_t>(1, 2048)(gen));
      backing_ += std::string(1 + gen() % 7, '\xAB');  // Misaligning gap.
      cuts.emplace_back(backing_.size(), take);
      backing_.append(bytes + pos, take);
      pos += take;
    }
    for (const auto& [offset, size] : cuts) {
      scattered_.Append(absl::string_view(backing_).substr(offset, size));
    }
  }
  const ScatteredBytes* get() const { return &scattered_; }

 private:
  std::string backing_;
  ScatteredBytes scattered_;
};

// Scattered input (InputTensor::scattered) is read piece by piece for
// LayerNorm, L2 norm and BatchNorm eval and gathered first elsewhere: every
// path must give bitwise the outputs and model of contiguous input, streamed or
// not.
template <typename T>
void CheckScatteredMatchesContiguous() {
  struct Case {
    NormMode mode;
    Shape shape;
    int32_t axis_or_k;
    bool training;
  };
  const Case cases[] = {
      {NormMode::kLayerNorm, {300, 768}, 1, false},
      {NormMode::kLayerNorm, {37, 5, 11}, 2, false},
      {NormMode::kLayerNorm, {2, 40000}, 1, false},  // Long rows: gathered.
      {NormMode::kBatchNorm, {4, 16, 40, 40}, 1, false},
      {NormMode::kBatchNorm, {4, 40, 40, 16}, -1, false},
      {NormMode::kBatchNorm, {64, 3}, 1, false},
      {NormMode::kBatchNorm, {4, 16, 40, 40}, 1, true},  // Gathered.
      {NormMode::kL2Norm, {300, 768}, 1, false},
      {NormMode::kL2Norm, {2, 40000}, 1, false},       // Gathered.
      {NormMode::kWeightNorm, {64, 48, 9}, 1, false},  // Gathered.
  };
  for (int64_t threshold : {int64_t{0}, std::numeric_limits<int64_t>::max()}) {
    SetStreamingOutputBytes(threshold);
    for (const Case& c : cases) {
      SCOPED_TRACE(::testing::Message()
                   << c.shape.size() << "d mode " << static_cast<int>(c.mode)
                   << " k/axis " << c.axis_or_k << " stream "
                   << (threshold == 0));
      int64_t n = 1;
      for (int64_t d : c.shape) n *= d;
      const auto x = RandomValues<T>(n, 21, 4.0, 3.0);
      const RandomChunks chunks(x, 22);
      auto run = [&](bool scattered, std::optional<BatchNormModel>& model) {
        Engine engine;
        if (c.mode == NormMode::kBatchNorm && !c.training) {
          // A fitted model, so that eval uses non-trivial statistics.
          FitSpec fit{"m", View(x, c.shape), c.axis_or_k};
          EXPECT_TRUE(engine.Fit(fit).ok());
        }
        NormalizeSpec spec = TrainingSpec("m", x, c.shape, c.axis_or_k);
        spec.mode = c.mode;
        spec.training = c.training;
        spec.normalized_ndim = c.axis_or_k;
        if (c.mode == NormMode::kL2Norm || c.mode == NormMode::kWeightNorm) {
          spec.model.clear();  // Stateless.
          spec.channel_axis.reset();
        }
        if (c.mode == NormMode::kWeightNorm) {
          spec.normalized_ndim = 0;
          spec.channel_axis = c.axis_or_k;
        }
        if (scattered) {
          spec.input.data = nullptr;
          spec.input.scattered = chunks.get();
        }
        EXPECT_EQ(Engine::ReadsScatteredInPlace(spec),
                  c.training == false && c.shape.back() != 40000 &&
                      c.mode != NormMode::kWeightNorm);
        std::vector<T> y(n);
        auto result = engine.Normalize(spec, y.data());
        EXPECT_TRUE(result.ok()) << result.status();
        if (result.ok()) model = *result;
        return y;
      };
      std::optional<BatchNormModel> model_contiguous, model_scattered;
      const auto contiguous = run(false, model_contiguous);
      const auto scattered = run(true, model_scattered);
      EXPECT_EQ(std::memcmp(contiguous.data(), scattered.data(), n * sizeof(T)),
                0);
      ASSERT_EQ(model_contiguous.has_value(), model_scattered.has_value());
      if (model_contiguous.has_value()) {
        EXPECT_EQ(model_contiguous->running_mean,
                  model_scattered->running_mean);
        EXPECT_EQ(model_contiguous->running_var, model_scattered->running_var);
      }
    }
  }
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
  // Fit gathers scattered input: the same statistics.
  const auto x = RandomValues<T>(4 * 16 * 40 * 40, 23, 4.0, 3.0);
  const RandomChunks chunks(x, 24);
  Engine a, b;
  FitSpec fit{"m", View(x, {4, 16, 40, 40}), 1};
  const auto fitted = a.Fit(fit);
  fit.input.data = nullptr;
  fit.input.scattered = chunks.get();
  const auto fitted_scattered = b.Fit(fit);
  ASSERT_TRUE(fitted.ok() && fitted_scattered.ok());
  EXPECT_EQ(fitted->running_var, fitted_scattered->running_var);
}

TEST(ScatteredInputTest, EveryPathMatchesContiguousBitwise) {
  CheckScatteredMatchesContiguous<float>();
  CheckScatteredMatchesContiguous<double>();
}

// The thread counts each determinism test compares with one thread: real
// threads in an arena of that size (ScopedComputeThreads), oversubscribed
// where the machine has fewer cores, so that every count takes the paths a
// machine of that many cores would.
constexpr int kThreadCounts[] = {2, 3, 8, 16};

// Runs f() with the compute arena at exactly `threads` threads.
template <typename F>
auto OnThreads(int threads, F f) {
  const ScopedComputeThreads scope(threads);
  EXPECT_EQ(ComputeConcurrency(), threads);
  return f();
}

// How often each thread-dependent path was taken since construction.
class PathsTaken {
 public:
  PathsTaken() {
    for (int p = 0; p < kPaths; ++p) {
      start_[p] = ThreadPathCount(static_cast<ThreadPath>(p));
    }
  }
  int64_t operator()(ThreadPath path) const {
    return ThreadPathCount(path) - start_[static_cast<int>(path)];
  }

 private:
  static constexpr int kPaths = static_cast<int>(ThreadPath::kCount);
  int64_t start_[kPaths];
};

// Expects a Normalize of `spec` into a float output to give the same bytes
// on every count of kThreadCounts as on 1, on every SIMD target.
void ExpectSameBitsOnAnyThreads(const NormalizeSpec& spec,
                                const std::string& what) {
  ForEachSimdTarget([&](const std::string& target) {
    auto run = [&](int threads) {
      return OnThreads(threads, [&] {
        Engine engine;
        std::vector<float> y(spec.input.size);
        EXPECT_TRUE(engine.Normalize(spec, y.data()).ok()) << what;
        return y;
      });
    };
    const std::vector<float> one = run(1);
    for (int threads : kThreadCounts) {
      EXPECT_EQ(std::memcmp(one.data(), run(threads).data(),
                            one.size() * sizeof(float)),
                0)
          << what << " on " << threads << " threads, " << target;
    }
  });
}

TEST(DeterminismTest, OutputsAndStatisticsBitwiseEqualFor1AndNThreads) {
  const PathsTaken taken;
  struct Case {
    Shape shape;
    int32_t axis;
  };
  const Case cases[] = {{{64, 3, 64, 64}, 1},
                        {{64, 64, 64, 3}, -1},
                        {{200000, 7}, 1},
                        {{2, 3, 300000}, 1},
                        {{1, 5, 700, 300}, 1},
                        {{3, 20000, 33}, 2},
                        // LayerNorm rows of 40000: whole rows per work item
                        // on 1 and 2 threads (8 rows, 4 per thread), spread
                        // over the threads one at a time on 3 and more (see
                        // LayerNormKernel).
                        {{8, 2, 20000}, 1}};
  ForEachSimdTarget([&](const std::string& target) {
    for (const Case& c : cases) {
      int64_t n = 1;
      for (int64_t d : c.shape) n *= d;
      const auto x = RandomValues<float>(n, 9, 1e3, 5.0);
      auto run = [&](int threads) {
        return OnThreads(threads, [&] {
          Engine engine;
          NormalizeSpec spec = TrainingSpec("d", x, c.shape, c.axis);
          std::vector<float> y(n);
          auto model = engine.Normalize(spec, y.data());
          EXPECT_TRUE(model.ok());
          spec.mode = NormMode::kLayerNorm;
          spec.normalized_ndim = 2;
          std::vector<float> ln(n);
          EXPECT_TRUE(engine.Normalize(spec, ln.data()).ok());
          return std::make_tuple(y, ln, (*model)->running_var,
                                 (*model)->PooledVariance());
        });
      };
      const auto one = run(1);
      for (int threads : kThreadCounts) {
        SCOPED_TRACE(ShapeString(c.shape) + " on " + std::to_string(threads) +
                     " threads, " + target);
        const auto many = run(threads);
        EXPECT_EQ(std::memcmp(std::get<0>(one).data(), std::get<0>(many).data(),
                              n * sizeof(float)),
                  0);
        EXPECT_EQ(std::memcmp(std::get<1>(one).data(), std::get<1>(many).data(),
                              n * sizeof(float)),
                  0);
        EXPECT_EQ(std::get<2>(one), std::get<2>(many));
        EXPECT_EQ(std::get<3>(one), std::get<3>(many));
      }
    }
  });
  // Both ways of a long LayerNorm row were compared.
  EXPECT_GT(taken(ThreadPath::kLayerNormWholeLongRows), 0);
  EXPECT_GT(taken(ThreadPath::kLayerNormLongRowsSpread), 0);
}

TEST(DeterminismTest, GroupNormBitwiseEqualFor1AndNThreads) {
  const PathsTaken taken;
  // NCHW [16, 32, 64, 64] / 8 groups: 32 chunks of 4 groups, on one thread
  // each up to 8 threads, spread on 16. Channels-last [16, 64, 64, 32]: one
  // sample per task up to 4 threads (16 samples, 4 per thread), the
  // two-pass path on 8 and 16.
  const GroupCase cases[] = {{{16, 32, 64, 64}, 1, 8},
                             {{16, 64, 64, 32}, -1, 4},
                             {{2, 5, 4, 30000}, 2, 2}};
  for (const GroupCase& c : cases) {
    const auto x = RandomValues<float>(NumElementsOf(c.shape), 3, 1e3, 5.0);
    NormalizeSpec spec;
    spec.mode = NormMode::kGroupNorm;
    spec.num_groups = c.groups;
    spec.channel_axis = c.axis;
    spec.input = View(x, c.shape);
    ExpectSameBitsOnAnyThreads(spec, ShapeString(c.shape));
  }
  for (ThreadPath path :
       {ThreadPath::kGroupChunksOnOneThread, ThreadPath::kGroupChunksSpread,
        ThreadPath::kGroupSamplesFused, ThreadPath::kGroupSamplesTwoPass}) {
    EXPECT_GT(taken(path), 0) << "path " << static_cast<int>(path);
  }
}

TEST(DeterminismTest, L2AndWeightNormBitwiseEqualFor1AndNThreads) {
  // L2 rows short, long (one at a time over every thread) and of two dims;
  // Weight Norm of a [4096, 512] weight at dims 0 and 1, and of a conv
  // weight.
  struct Case {
    NormMode mode;
    Shape shape;
    int32_t dims_or_axis;
  };
  const Case cases[] = {{NormMode::kL2Norm, {20000, 96}, 1},
                        {NormMode::kL2Norm, {3, 200000}, 1},
                        {NormMode::kL2Norm, {64, 32, 48}, 2},
                        {NormMode::kWeightNorm, {4096, 512}, 0},
                        {NormMode::kWeightNorm, {4096, 512}, 1},
                        {NormMode::kWeightNorm, {256, 64, 3, 3}, 0}};
  for (const Case& c : cases) {
    const auto x = RandomValues<float>(NumElementsOf(c.shape), 4, 1e3, 5.0);
    NormalizeSpec spec;
    spec.mode = c.mode;
    spec.input = View(x, c.shape);
    if (c.mode == NormMode::kL2Norm) {
      spec.normalized_ndim = c.dims_or_axis;
    } else {
      spec.channel_axis = c.dims_or_axis;
      const int64_t channels = c.shape[c.dims_or_axis];
      spec.weight =
          AffineParam{{channels}, RandomValues<double>(channels, 5, 1.0, 0.2)};
    }
    ExpectSameBitsOnAnyThreads(spec, ShapeString(c.shape));
  }
}

}  // namespace
}  // namespace normd

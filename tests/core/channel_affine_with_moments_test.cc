// ChannelAffineWithMoments, the eval pass that also takes its input's
// moments (drift observation), against the two kernels it fuses: its
// moments must be ChannelMoments' with the means as shift hints bit for
// bit, and its output ChannelAffineKernel's byte for byte, with means near
// the data (hints taken) and far from it (hints refused: ChannelMoments'
// own bits), in every dtype and layout (each strategy of the reduction,
// blocks written as read and blocks written from cache), in place and not,
// with streaming stores and without, with a misaligned output, a constant
// channel (the exact path), NaNs (of patterns the narrowing would not make
// canonical) and Infs, and channels pruned to scale 0 (NaNs from values
// that are not), on every SIMD target and at 1 and 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "server/core/half.h"
#include "server/core/kernels.h"
#include "server/core/layout.h"
#include "server/core/moments.h"
#include "server/core/parallel.h"
#include "server/core/simd/streaming.h"
#include "tests/testing/reference.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::RandomValues;

struct Case {
  const char* name;
  ChannelLayout layout;
  // Has long blocks or channels-last whole tiles, which take shift hints.
  bool takes_hints;
};

// One per path: long runs in whole and partial blocks (NCHW), runs of one
// channel (outer 1), short runs, channels-last whole tiles (written as
// read), channels-last narrow tiles and wide blocks split into channel
// ranges (written from cache).
const Case kCases[] = {
    {"nchw", {.outer = 3, .channels = 5, .inner = 1000}, true},
    {"nchw_two_blocks", {.outer = 2, .channels = 3, .inner = 70001}, true},
    {"nchw_short_block",
     {.outer = 2, .channels = 2, .inner = 32768 + 200},
     true},
    {"one_run_channels", {.outer = 1, .channels = 37, .inner = 49}, false},
    {"short_runs", {.outer = 40, .channels = 6, .inner = 9}, false},
    {"nhwc64", {.outer = 3000, .channels = 64, .inner = 1}, true},
    {"nhwc128", {.outer = 700, .channels = 128, .inner = 1}, true},
    {"nhwc100", {.outer = 900, .channels = 100, .inner = 1}, true},
    {"nhwc8", {.outer = 999, .channels = 8, .inner = 1}, false},
    {"nhwc2048", {.outer = 40, .channels = 2048, .inner = 1}, true},
};

constexpr DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                             DType::kFloat64};

// The tensor's bytes in `dtype`: normal values around 3; when `special`,
// channel 1 constant (its moments, and those of a channels-last block with
// it, take the exact path), a NaN in channel 0, an Inf in the last channel
// and, in 16-bit tensors, NaN patterns that the narrowing's integer steps
// would not make canonical (a negative NaN, a signaling one) in the middle
// of channel 0's first run and of the last channel's last; and 3e38 (Inf
// in float16) in the middle of channel 1's last run.
std::vector<char> TensorBytes(DType dtype, const ChannelLayout& layout,
                              bool special) {
  const int64_t n = layout.NumElements();
  std::vector<double> values = RandomValues<double>(n, 17, 3.0, 2.0);
  if (special) {
    for (int64_t i = 0; i < n; ++i) {
      if ((i / layout.inner) % layout.channels == 1) values[i] = 1.25;
    }
    values[0] = std::numeric_limits<double>::quiet_NaN();
    values[n - 1] = std::numeric_limits<double>::infinity();
    values[((layout.outer - 1) * layout.channels + 1) * layout.inner +
           layout.inner / 2] = 3e38;
  }
  const int64_t size = ElementSize(dtype);
  std::vector<char> bytes(n * size);
  for (int64_t i = 0; i < n; ++i) {
    char* at = bytes.data() + i * size;
    if (dtype == DType::kFloat64) {
      std::memcpy(at, &values[i], 8);
    } else if (dtype == DType::kFloat32) {
      const auto v = static_cast<float>(values[i]);
      std::memcpy(at, &v, 4);
    } else {
      const uint16_t v = DoubleToHalf(dtype, values[i]);
      std::memcpy(at, &v, 2);
    }
  }
  if (special && ElementSize(dtype) == 2) {
    const uint16_t negative_nan = 0xffff;
    const uint16_t signaling_nan = dtype == DType::kBFloat16 ? 0x7f81 : 0x7c01;
    // Channels-last: in the middle row.
    const bool last = layout.inner == 1;
    auto at = [&](int64_t row, int64_t channel) {
      return bytes.data() + ((row * layout.channels + channel) * layout.inner +
                             layout.inner / 2) *
                                2;
    };
    std::memcpy(at(last ? layout.outer / 2 : 0, 0), &negative_nan, 2);
    std::memcpy(
        at(last ? layout.outer / 2 : layout.outer - 1, layout.channels - 1),
        &signaling_nan, 2);
  }
  return bytes;
}

std::string MomentsBits(const std::vector<Moments>& moments) {
  std::string bits;
  for (const Moments& m : moments) {
    bits.append(reinterpret_cast<const char*>(&m.count), sizeof(m.count));
    // NaN as one pattern: which NaN the hardware makes is not the contract.
    for (double v : {m.mean, m.m2}) {
      const double canonical =
          std::isnan(v) ? std::numeric_limits<double>::quiet_NaN() : v;
      bits.append(reinterpret_cast<const char*>(&canonical), sizeof(double));
    }
  }
  return bits;
}

// Checks one case: the fused pass into a buffer at byte `offset` from a
// 64-byte boundary (or in place) against the two kernels, with means near
// the data's (3) or `drifted` far from them, and `pruned` channels.
void CheckCase(const Case& c, DType dtype, bool special, int64_t offset,
               bool in_place, bool drifted = false, bool pruned = false) {
  SCOPED_TRACE(std::string(c.name) + " dtype " +
               std::to_string(static_cast<int>(dtype)) +
               (special ? " special" : "") + " offset " +
               std::to_string(offset) + (in_place ? " in place" : "") +
               (drifted ? " drifted" : "") + (pruned ? " pruned" : ""));
  const ChannelLayout& layout = c.layout;
  const std::vector<char> input = TensorBytes(dtype, layout, special);
  const int64_t bytes = static_cast<int64_t>(input.size());
  std::vector<double> mean(layout.channels), scale(layout.channels),
      shift(layout.channels);
  for (int64_t k = 0; k < layout.channels; ++k) {
    // Near the data's means, or far from them.
    mean[k] = (drifted ? 40.0 : 3.0) + 1e-5 * k;
    scale[k] = 0.5 + 0.125 * (k % 7);
    shift[k] = -1.0 + 0.25 * (k % 5);
  }
  // Pruned channels (scale 0): with special values, the last one's Inf, and
  // channel 1's 3e38 minus its mean (an fp32 overflow), times 0 make NaNs
  // from values that are not.
  if (pruned) {
    scale[1] = 0.0;
    mean[1] = -3e38;
    scale[layout.channels - 1] = 0.0;
  }

  const std::vector<Moments> want_moments =
      ChannelMoments(dtype, input.data(), layout, mean.data());
  // Means near the data are taken as shifts (other bits than the plain
  // kernel's) by channels-last tiles; far from it, by none. (A NaN or
  // an Inf makes its channel's moments NaN either way.)
  const bool hints_taken =
      MomentsBits(want_moments) !=
      MomentsBits(ChannelMoments(dtype, input.data(), layout));
  if (!special) {
    EXPECT_EQ(hints_taken,
              !drifted && c.takes_hints && dtype != DType::kFloat64);
  }
  std::vector<char> want(bytes);
  ChannelAffineKernel(dtype, {input.data()}, want.data(), layout, mean.data(),
                      scale.data(), shift.data());

  // 64-byte aligned storage, used from `offset`.
  std::vector<char> storage(bytes + 128);
  char* aligned = storage.data() +
                  (64 - reinterpret_cast<uintptr_t>(storage.data()) % 64) % 64;
  char* out = aligned + offset;
  const char* in = input.data();
  if (in_place) {
    std::memcpy(out, input.data(), bytes);
    in = out;
  }
  const std::vector<Moments> got_moments = ChannelAffineWithMoments(
      dtype, in, out, layout, mean.data(), scale.data(), shift.data());
  EXPECT_EQ(MomentsBits(got_moments), MomentsBits(want_moments));
  int64_t first_difference = 0;
  while (first_difference < bytes &&
         out[first_difference] == want[first_difference]) {
    ++first_difference;
  }
  EXPECT_EQ(first_difference, bytes)
      << "output differs from byte " << first_difference << " of " << bytes;
}

void CheckEveryCase() {
  for (const Case& c : kCases) {
    for (DType dtype : kDTypes) {
      CheckCase(c, dtype, /*special=*/false, 0, /*in_place=*/false);
      CheckCase(c, dtype, /*special=*/true, 0, /*in_place=*/false);
      CheckCase(c, dtype, /*special=*/true, 0, /*in_place=*/false,
                /*drifted=*/false, /*pruned=*/true);
      CheckCase(c, dtype, /*special=*/false, ElementSize(dtype),
                /*in_place=*/false);
      CheckCase(c, dtype, /*special=*/false, 0, /*in_place=*/true);
      CheckCase(c, dtype, /*special=*/false, 0, /*in_place=*/false,
                /*drifted=*/true);
    }
  }
}

// Parameter: the output size from which the kernels store with streaming
// stores (0: always).
class ChannelAffineWithMomentsTest : public ::testing::TestWithParam<int64_t> {
};

TEST_P(ChannelAffineWithMomentsTest, EqualsTheMomentsAndTheAffineItFuses) {
  SetStreamingOutputBytes(GetParam());
  ForEachSimdTarget([&](const std::string&) { CheckEveryCase(); });
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

INSTANTIATE_TEST_SUITE_P(Stores, ChannelAffineWithMomentsTest,
                         ::testing::Values(kDefaultStreamingOutputBytes,
                                           int64_t{0}),
                         [](const ::testing::TestParamInfo<int64_t>& info) {
                           return info.param == 0 ? "Streaming" : "Default";
                         });

// The moments (with shift hints taken, and refused by a drifted model) and
// the output are the same bits on every target: the hints' tests are too.
TEST(ChannelAffineWithMomentsTargetsTest, SameBitsOnEveryTarget) {
  for (const Case& c : kCases) {
    for (DType dtype : kDTypes) {
      for (double means : {3.0, 40.0}) {
        SCOPED_TRACE(std::string(c.name) + " dtype " +
                     std::to_string(static_cast<int>(dtype)) + " means " +
                     std::to_string(means));
        const std::vector<char> input =
            TensorBytes(dtype, c.layout, /*special=*/false);
        std::vector<double> mean(c.layout.channels, means),
            scale(c.layout.channels, 0.75), shift(c.layout.channels, 0.5);
        std::vector<std::string> targets, results;
        ForEachSimdTarget([&](const std::string& target) {
          std::vector<char> out(input.size());
          const std::vector<Moments> moments = ChannelAffineWithMoments(
              dtype, input.data(), out.data(), c.layout, mean.data(),
              scale.data(), shift.data());
          targets.push_back(target);
          results.push_back(MomentsBits(moments) +
                            std::string(out.begin(), out.end()));
        });
        for (size_t t = 1; t < results.size(); ++t) {
          EXPECT_TRUE(results[t] == results[0])
              << targets[t] << " against " << targets[0];
        }
      }
    }
  }
}

// Parameter: the compute threads.
class ChannelAffineWithMomentsThreadsTest
    : public ::testing::TestWithParam<int> {};

TEST_P(ChannelAffineWithMomentsThreadsTest, SameBitsAsTheKernelsItFuses) {
  SetStreamingOutputBytes(0);
  const ScopedComputeThreads scope(GetParam());
  CheckEveryCase();
  SetStreamingOutputBytes(kDefaultStreamingOutputBytes);
}

INSTANTIATE_TEST_SUITE_P(OneAndTwo, ChannelAffineWithMomentsThreadsTest,
                         ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "Threads" + std::to_string(info.param);
                         });

}  // namespace
}  // namespace normd

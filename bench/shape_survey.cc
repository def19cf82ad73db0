// Shapes the kernel benchmarks do not cover, each 64 MiB, timed in one
// process against a parallel copy of the same bytes: every repetition runs
// the copy and then the kernel, and a shape's ratio (copy time / kernel
// time, as kernel_bench's bandwidth ratios) is the median of its
// repetitions' own ratios. Finds shapes where a kernel falls far below the
// copy (it found slow paths for long LayerNorm rows, 16-bit rows over 64 Ki
// values and channels in runs of 16-255 values). A benchmark, not a test: it
// asserts nothing.
//
// Usage: shape_survey [--reps=N] [--threads=N] [--filter=substring]
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/engine.h"
#include "server/core/half.h"

ABSL_FLAG(int, reps, 7, "Repetitions per shape (copy, then kernel).");
ABSL_FLAG(int, threads, 2, "Threads for the kernels and the copy.");
ABSL_FLAG(std::string, filter, "",
          "Only shapes whose name contains this substring.");

namespace {

using normd::DType;
using normd::Engine;
using normd::InputTensor;
using normd::NormalizeSpec;
using normd::NormMode;
using normd::Shape;

constexpr int64_t kBytes = int64_t{64} << 20;

// A 64-byte-aligned buffer of `bytes`, as the service's BufferPool gives.
struct AlignedBuffer {
  explicit AlignedBuffer(int64_t bytes)
      : data(static_cast<char*>(std::aligned_alloc(64, bytes))) {}
  ~AlignedBuffer() { std::free(data); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  char* data;
};

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Case {
  std::string name;
  NormalizeSpec spec;
  bool train_first = false;  // BatchNorm eval: its model comes from training.
};

// `mode` over `shape` (64 MiB of `dtype` at `data`), channel axis or
// normalized dims and groups as the mode takes them.
Case Make(NormMode mode, Shape shape, DType dtype, const void* data,
          int32_t axis_or_ndim, int64_t groups = 0, bool training = false) {
  Case c;
  const char* mode_name = mode == NormMode::kLayerNorm      ? "LayerNorm"
                          : mode == NormMode::kRmsNorm      ? "RMSNorm"
                          : mode == NormMode::kGroupNorm    ? "GroupNorm"
                          : mode == NormMode::kInstanceNorm ? "InstanceNorm"
                          : training                        ? "BatchNorm train"
                                                            : "BatchNorm eval";
  const bool rows = mode == NormMode::kLayerNorm || mode == NormMode::kRmsNorm;
  c.name = absl::StrCat(mode_name, dtype == DType::kFloat32 ? "" : " bf16",
                        " [", absl::StrJoin(shape, ","), "]",
                        rows || axis_or_ndim == 1 ? "" : " channels-last");
  c.spec.mode = mode;
  c.spec.num_groups = groups;
  if (rows) {
    c.spec.normalized_ndim = axis_or_ndim;
  } else {
    c.spec.channel_axis = axis_or_ndim;
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  c.spec.input = InputTensor{dtype, shape, data, n};
  if (mode == NormMode::kBatchNorm) {
    // A model per shape and layout (the channel count alone can repeat).
    c.spec.model =
        absl::StrCat("survey-", absl::StrJoin(shape, "x"), "-", axis_or_ndim);
    c.spec.training = training;
    c.train_first = !training;
  }
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times normd's kernels on shapes the kernel benchmarks do not cover, "
      "against a copy of the same 64 MiB.\nUsage: shape_survey [--reps=N] "
      "[--threads=N] [--filter=substring]");
  absl::ParseCommandLine(argc, argv);
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism,
                              absl::GetFlag(FLAGS_threads));
  const int64_t floats = kBytes / 4;
  AlignedBuffer input(kBytes), output(kBytes), copy(kBytes), halves(kBytes);
  auto* x = reinterpret_cast<float*>(input.data);
  auto* h = reinterpret_cast<uint16_t*>(halves.data);
  std::mt19937 random(1);
  std::normal_distribution<float> normal(3.0f, 2.0f);
  for (int64_t i = 0; i < floats; ++i) x[i] = normal(random);
  for (int64_t i = 0; i < 2 * floats; ++i) {
    h[i] = normd::FloatToBFloat16(x[i % floats]);
  }
  const DType f32 = DType::kFloat32;
  const DType bf16 = DType::kBFloat16;
  std::vector<Case> cases = {
      Make(NormMode::kLayerNorm, {16, 1 << 20}, f32, x, 1),
      Make(NormMode::kLayerNorm, {512, 32768}, f32, x, 1),
      Make(NormMode::kLayerNorm, {65536, 256}, f32, x, 1),
      Make(NormMode::kLayerNorm, {131072, 128}, f32, x, 1),
      Make(NormMode::kRmsNorm, {262144, 64}, f32, x, 1),
      Make(NormMode::kLayerNorm, {1 << 20, 16}, f32, x, 1),
      Make(NormMode::kLayerNorm, {256, 131072}, bf16, h, 1),
      Make(NormMode::kLayerNorm, {512, 65536}, bf16, h, 1),
      // Attention heads (QK-norm) in bf16.
      Make(NormMode::kRmsNorm, {524288, 64}, bf16, h, 1),
      Make(NormMode::kLayerNorm, {262144, 128}, bf16, h, 1),
      Make(NormMode::kGroupNorm, {1, 64, 512, 512}, f32, x, 1, 32),
      Make(NormMode::kGroupNorm, {1, 512, 512, 64}, f32, x, -1, 32),
      Make(NormMode::kGroupNorm, {64, 32, 32, 256}, f32, x, -1, 32),
      Make(NormMode::kGroupNorm, {1024, 64, 16, 16}, f32, x, 1, 32),
      // Channels-last with fewer than 64 channels (the narrow tiles).
      Make(NormMode::kGroupNorm, {64, 128, 128, 16}, f32, x, -1, 8),
      Make(NormMode::kBatchNorm, {128, 64, 64, 32}, f32, x, -1, 0, true),
      // Channels-last with several register tiles (rows first).
      Make(NormMode::kBatchNorm, {64, 32, 32, 256}, f32, x, -1, 0, true),
      Make(NormMode::kGroupNorm, {32, 32, 32, 1024}, bf16, h, -1, 32),
      Make(NormMode::kInstanceNorm, {4096, 64, 8, 8}, f32, x, 1),
      Make(NormMode::kInstanceNorm, {1, 512, 512, 64}, f32, x, -1),
      Make(NormMode::kBatchNorm, {4096, 64, 8, 8}, f32, x, 1, 0, true),
      Make(NormMode::kBatchNorm, {5349, 64, 7, 7}, f32, x, 1, 0, true),
      Make(NormMode::kBatchNorm, {4096, 64, 8, 8}, f32, x, 1),
      Make(NormMode::kBatchNorm, {5349, 64, 7, 7}, f32, x, 1),
      Make(NormMode::kBatchNorm, {10698, 64, 7, 7}, bf16, h, 1),
      Make(NormMode::kBatchNorm, {16384, 1024}, f32, x, 1),
  };
  const std::string filter = absl::GetFlag(FLAGS_filter);
  std::erase_if(
      cases, [&](const Case& c) { return !absl::StrContains(c.name, filter); });
  Engine engine;
  for (Case& c : cases) {
    if (c.train_first) {
      NormalizeSpec train = c.spec;
      train.training = true;
      if (auto r = engine.Normalize(train, output.data); !r.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name.c_str(),
                     r.status().ToString().c_str());
        return 1;
      }
    }
  }
  auto run_copy = [&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, kBytes, 1 << 18),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        std::memcpy(copy.data + r.begin(),
                                    input.data + r.begin(), r.size());
                      });
  };
  run_copy();  // Faults in the copy's pages before anything is timed.
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::vector<std::vector<double>> ratios(cases.size()), times(cases.size());
  std::vector<double> copies;
  for (int rep = 0; rep < reps; ++rep) {
    for (size_t i = 0; i < cases.size(); ++i) {
      // A warm-up call, then the copy and the timed call.
      for (int timed = 0; timed < 2; ++timed) {
        const double t0 = NowMs();
        if (timed) run_copy();
        const double t1 = NowMs();
        if (auto r = engine.Normalize(cases[i].spec, output.data); !r.ok()) {
          std::fprintf(stderr, "%s: %s\n", cases[i].name.c_str(),
                       r.status().ToString().c_str());
          return 1;
        }
        const double t2 = NowMs();
        if (timed) {
          copies.push_back(t1 - t0);
          times[i].push_back(t2 - t1);
          ratios[i].push_back((t1 - t0) / (t2 - t1));
        }
      }
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("%-44s %9s %12s\n", "shape (64 MiB)", "ms", "vs copy bw");
  for (size_t i = 0; i < cases.size(); ++i) {
    std::printf("%-44s %9.2f %11.2fx\n", cases[i].name.c_str(),
                median(times[i]), median(ratios[i]));
  }
  if (!copies.empty()) {
    std::printf("copy: %.2f ms (median of %zu)\n", median(copies),
                copies.size());
  }
  return 0;
}

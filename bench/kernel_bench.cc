// In-process kernel benchmarks (Google Benchmark): normd's core against the
// memory-bus baselines — a plain parallel copy of the same size (for outputs)
// and a parallel read-only sum (for statistics only), each also timed right
// before every kernel iteration (see TimePaired). fp32 unless named, 64 MiB
// tensors (NORMD_BENCH_MIB: larger ones), oneTBB limited to
// NORMD_BENCH_THREADS (default 2).
//
//   build/bench/kernel_bench --benchmark_repetitions=5 \
//       --benchmark_display_aggregates_only=true
//   NORMD_BENCH_MIB=512 build/bench/kernel_bench --benchmark_filter=Observed
#include <benchmark/benchmark.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/parallel_for.h>
#include <tbb/parallel_reduce.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"
#include "server/core/engine.h"
#include "server/core/half.h"
#include "server/core/simd/row_affine.h"
#include "server/core/simd/streaming.h"
#include "server/core/simd/target.h"

namespace normd {
namespace {

// Every tensor's size: 64 MiB times the scale, NORMD_BENCH_MIB / 64 (set
// by main before any benchmark runs); the shapes' first dimension grows
// with it. 512 MiB, say, measures past a large last-level cache.
int64_t tensor_scale = 1;
int64_t Scale() { return tensor_scale; }
int64_t TensorBytes() { return tensor_scale * (int64_t{64} << 20); }
int64_t TensorElements() {
  return TensorBytes() / static_cast<int64_t>(sizeof(float));
}

// Allocates 64-byte aligned (cache-line) storage, as the service's
// BufferPool does for every tensor it computes into: kernels stream whole
// lines, so a buffer that starts mid-line (malloc gives 16 bytes) measures a
// case the service never has.
template <typename T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <typename U>
  explicit CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t count) {
    const size_t bytes = (count * sizeof(T) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) std::abort();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) { std::free(p); }
  bool operator==(const CacheLineAllocator&) const { return true; }
};
template <typename T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

const AlignedVector<float>& Input() {
  static const AlignedVector<float>* input = [] {
    auto* v = new AlignedVector<float>(TensorElements());
    std::mt19937 gen(1);
    std::normal_distribution<float> dist(3.0f, 2.0f);
    for (float& x : *v) x = dist(gen);
    return v;
  }();
  return *input;
}

AlignedVector<float>& Output() {
  static auto* output = new AlignedVector<float>(TensorElements(), 1.0f);
  return *output;
}

void SetBytes(benchmark::State& state, int64_t bytes_per_iteration) {
  state.SetBytesProcessed(state.iterations() * bytes_per_iteration);
}

// Baseline: parallel copy of 64 MiB (read + write).
void RunCopy() {
  const float* src = Input().data();
  float* dst = Output().data();
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, TensorElements(), 1 << 16),
                    [&](const tbb::blocked_range<int64_t>& r) {
                      std::memcpy(dst + r.begin(), src + r.begin(),
                                  (r.end() - r.begin()) * sizeof(float));
                    });
  benchmark::ClobberMemory();
}
void BM_Copy(benchmark::State& state) {
  for (auto _ : state) RunCopy();
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_Copy)->UseRealTime();

// The baselines' loops, built for AVX-512, AVX2 and baseline x86-64 and
// picked at load time (not under TSan, whose runtime the resolvers precede).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && \
    !defined(__SANITIZE_THREAD__)
#define BASELINE_LOOP \
  __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#else
#define BASELINE_LOOP
#endif

// Plain vectorized load/store copy, built for the widest ISA.
BASELINE_LOOP void CopyLoop(const float* __restrict src, float* __restrict dst,
                            int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// Baseline: parallel plain-store copy of 64 MiB.
void BM_CopyLoop(benchmark::State& state) {
  const float* src = Input().data();
  float* dst = Output().data();
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, TensorElements(), 1 << 14),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        CopyLoop(src + r.begin(), dst + r.begin(),
                                 r.end() - r.begin());
                      });
    benchmark::ClobberMemory();
  }
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_CopyLoop)->UseRealTime();

// 128 fp32 lanes (enough independent chains to be bandwidth-bound), built
// for the widest ISA.
BASELINE_LOOP float SumLoop(const float* __restrict src, int64_t n) {
  constexpr int kLanes = 128;
  float lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lanes[j] += src[i + j];
  }
  float acc = 0.0f;
  for (; i < n; ++i) acc += src[i];
  for (float l : lanes) acc += l;
  return acc;
}

// Baseline: parallel read-only sum of 64 MiB.
void RunReadSum() {
  const float* src = Input().data();
  float total = tbb::parallel_reduce(
      tbb::blocked_range<int64_t>(0, TensorElements(), 1 << 14), 0.0f,
      [&](const tbb::blocked_range<int64_t>& r, float acc) {
        return acc + SumLoop(src + r.begin(), r.end() - r.begin());
      },
      [](float a, float b) { return a + b; });
  benchmark::DoNotOptimize(total);
}
void BM_ReadSum(benchmark::State& state) {
  for (auto _ : state) RunReadSum();
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_ReadSum)->UseRealTime();

// The SIMD targets every kernel row is timed on, in one process: AVX3
// (AVX-512) and AVX2 where the CPU runs both and NORMD_SIMD_TARGET does not
// pick one; otherwise none (the kernels run on the dispatch's own choice).
struct PairedTargets {
  int64_t first = 0;
  int64_t second = 0;
};
const PairedTargets& TargetsToPair() {
  static const PairedTargets pair = [] {
    PairedTargets p;
    const int64_t both = HWY_AVX3 | HWY_AVX2;
    if (std::getenv(kSimdTargetVariable) == nullptr &&
        (HWY_TARGETS & both) == both &&
        (hwy::SupportedTargets() & both) == both) {
      p = {HWY_AVX3, HWY_AVX2};
    }
    return p;
  }();
  return pair;
}

// Pins Highway's dispatch to `target` (0: the CPU's own choice again).
void PinTarget(int64_t target) {
  hwy::SetSupportedTargetsForTest(target);
  hwy::GetChosenTarget().Update(hwy::SupportedTargets());
}

// Times run() (manual time), each iteration right after a run of its
// baseline (RunCopy or RunReadSum), whose mean time per iteration becomes
// the counter "baseline_s". The shared machine's memory bandwidth drifts by
// tens of percent within seconds; a baseline timed next to each kernel
// iteration sees the same load, so report.py takes each repetition's
// ratio of the two (then the median) instead of comparing medians taken
// minutes apart. Where TargetsToPair gives two targets, each iteration runs
// the kernel on both, in alternating order: the first target's time is the
// iteration's, the second's mean becomes the counter "avx2_s", so that
// report.py takes per-repetition ratios of the targets too.
template <typename Run>
void TimePaired(benchmark::State& state, void (*baseline)(), const Run& run) {
  using Clock = std::chrono::steady_clock;
  const PairedTargets& targets = TargetsToPair();
  auto timed = [&](int64_t target) {
    if (target != 0) PinTarget(target);
    const Clock::time_point start = Clock::now();
    run();
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  double baseline_seconds = 0.0;
  double second_seconds = 0.0;
  int64_t iteration = 0;
  for (auto _ : state) {
    // The baseline on the first target: the last iteration may have left
    // dispatch pinned to the second (a dispatched baseline, such as
    // RunPlainEval, would alternate between them).
    if (targets.second != 0) PinTarget(targets.first);
    const Clock::time_point start = Clock::now();
    baseline();
    baseline_seconds +=
        std::chrono::duration<double>(Clock::now() - start).count();
    if (targets.second == 0) {
      state.SetIterationTime(timed(0));
      continue;
    }
    double first = 0.0;
    if (iteration++ % 2 == 0) {
      first = timed(targets.first);
      second_seconds += timed(targets.second);
    } else {
      second_seconds += timed(targets.second);
      first = timed(targets.first);
    }
    state.SetIterationTime(first);
  }
  state.counters["baseline_s"] =
      benchmark::Counter(baseline_seconds, benchmark::Counter::kAvgIterations);
  if (targets.second != 0) {
    PinTarget(0);
    state.counters["avx2_s"] =
        benchmark::Counter(second_seconds, benchmark::Counter::kAvgIterations);
  }
}

// Reference points, not targets: what the memory system allows the kernels
// that must read their input twice. A copy with streaming stores (the output
// path of every large kernel), and the floor of a two-pass kernel over 4 MiB
// samples (GroupNorm / InstanceNorm NHWC): each sample read once for
// statistics, then read again forwards and streamed out, one sample per
// task. (A variant that wrote each sample backwards was slower and noisier:
// docs/design/kernels.md, dead ends.)
// A copy through the kernels' streaming writer: the identity row affine
// (x - 0 - 0) * 1, streamed and fenced.
void StreamCopy(float* dst, const float* src, int64_t n) {
  RowAffineWrite(DType::kFloat32, DType::kFloat32, src, dst, n,
                 RowAffine{.scale = 1.0}, {.stream = true});
  StreamFence();
}

void BM_StreamCopy(benchmark::State& state) {
  const float* src = Input().data();
  float* dst = Output().data();
  for (auto _ : state) {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, TensorElements(), 1 << 14),
                      [&](const tbb::blocked_range<int64_t>& r) {
                        StreamCopy(dst + r.begin(), src + r.begin(),
                                   r.end() - r.begin());
                      });
    benchmark::ClobberMemory();
  }
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_StreamCopy)->UseRealTime();

void BM_TwoPassFloor(benchmark::State& state) {
  constexpr int64_t kSample = 1 << 20;  // 4 MiB of fp32.
  const float* src = Input().data();
  float* dst = Output().data();
  for (auto _ : state) {
    tbb::parallel_for(
        tbb::blocked_range<int64_t>(0, TensorElements() / kSample, 1),
        [&](const tbb::blocked_range<int64_t>& r) {
          for (int64_t s = r.begin(); s < r.end(); ++s) {
            benchmark::DoNotOptimize(SumLoop(src + s * kSample, kSample));
            StreamCopy(dst + s * kSample, src + s * kSample, kSample);
          }
        });
    benchmark::ClobberMemory();
  }
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_TwoPassFloor)->UseRealTime();

InputTensor View(const Shape& shape) {
  return InputTensor{DType::kFloat32, shape, Input().data(), TensorElements()};
}

// The timed loop of the Normalize benchmarks (output into `output`, by
// default Output()), paired with the copy baseline.
void TimeNormalize(benchmark::State& state, Engine& engine,
                   const NormalizeSpec& spec, float* output = nullptr) {
  if (output == nullptr) output = Output().data();
  TimePaired(state, RunCopy, [&] {
    auto result = engine.Normalize(spec, output);
    if (!result.ok()) state.SkipWithError("normalize failed");
    benchmark::ClobberMemory();
  });
}

// LayerNorm or RMSNorm over D of [1, T, D] (the largest T within 64 MiB),
// into Output() + `output_offset` floats (one row fewer when offset).
void TimeRows(benchmark::State& state, NormMode mode,
              int64_t output_offset = 0) {
  const int64_t d = state.range(0);
  Engine engine;
  NormalizeSpec spec;
  spec.mode = mode;
  // [1, T, D], T * D <= 64 MiB, leaving room for the offset.
  const int64_t rows = TensorElements() / d - (output_offset > 0 ? 1 : 0);
  spec.input = View({1, rows, d});
  spec.input.size = rows * d;
  TimeNormalize(state, engine, spec, Output().data() + output_offset);
  SetBytes(state, rows * d * static_cast<int64_t>(sizeof(float)));
}
void BM_LayerNorm(benchmark::State& state) {
  TimeRows(state, NormMode::kLayerNorm);
}
BENCHMARK(BM_LayerNorm)->Arg(768)->Arg(4096)->UseManualTime();
// Reference, not a target: LayerNorm [B,T,D] into an output that starts 16
// bytes into a cache line, as a plain malloc'd buffer does. Every row then
// starts and ends mid-line: partial lines written with plain stores beside
// the streaming ones (the service's outputs are 64-byte aligned).
void BM_LayerNormUnaligned(benchmark::State& state) {
  TimeRows(state, NormMode::kLayerNorm, /*output_offset=*/4);
}
BENCHMARK(BM_LayerNormUnaligned)->Arg(768)->UseManualTime();
void BM_RmsNorm(benchmark::State& state) {
  TimeRows(state, NormMode::kRmsNorm);
}
BENCHMARK(BM_RmsNorm)->Arg(768)->Arg(4096)->UseManualTime();
void BM_L2Norm(benchmark::State& state) { TimeRows(state, NormMode::kL2Norm); }
BENCHMARK(BM_L2Norm)->Arg(768)->Arg(4096)->UseManualTime();

// Weight Norm of a [4096 * scale, 4096] weight (64 MiB each) at PyTorch's dim 0
// (a norm per row) or 1 (per column, the channels-last walk), with g: the
// norms' pass over v, then the scaled copy.
void BM_WeightNorm(benchmark::State& state) {
  constexpr int64_t kSide = 4096;
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kWeightNorm;
  spec.input = View({kSide * Scale(), kSide});
  spec.channel_axis = static_cast<int32_t>(state.range(0));
  const int64_t norms = spec.input.shape[state.range(0)];
  spec.weight = AffineParam{{norms}, std::vector<double>(norms, 1.5)};
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_WeightNorm)->ArgName("dim")->Arg(0)->Arg(1)->UseManualTime();

// 16-bit LayerNorm / RMSNorm over D = 4096 of [1, T, 4096]: 32 Mi elements
// (64 MiB of bf16 / fp16, so the bytes moved match BM_Copy's). Arg 0 =
// bfloat16, 1 = float16; `rms` picks RMSNorm.
// 32 Mi bf16 values of Input() (64 MiB), built once.
const AlignedVector<uint16_t>& Halves() {
  static const AlignedVector<uint16_t>* halves = [] {
    auto* v = new AlignedVector<uint16_t>(2 * TensorElements());
    const AlignedVector<float>& src = Input();
    for (int64_t i = 0; i < 2 * TensorElements(); ++i) {
      (*v)[i] = FloatToBFloat16(src[i % TensorElements()]);
    }
    return v;
  }();
  return *halves;
}

void BM_HalfRows(benchmark::State& state) {
  const DType dtype = state.range(0) == 0 ? DType::kBFloat16 : DType::kFloat16;
  const bool rms = state.range(1) != 0;
  const AlignedVector<uint16_t>* halves = &Halves();
  Engine engine;
  NormalizeSpec spec;
  spec.mode = rms ? NormMode::kRmsNorm : NormMode::kLayerNorm;
  spec.input = InputTensor{dtype,
                           {1, 2 * TensorElements() / 4096, 4096},
                           halves->data(),
                           2 * TensorElements()};
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_HalfRows)
    ->ArgNames({"float16", "rms"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->UseManualTime();

// Reference, not a target: bf16 LayerNorm [1, T, 4096] with a weight and a
// bias (as trained models have), into the 64-byte aligned Output().
void BM_HalfLayerNormAffine(benchmark::State& state) {
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kLayerNorm;
  spec.input = InputTensor{DType::kBFloat16,
                           {1, 2 * TensorElements() / 4096, 4096},
                           Halves().data(),
                           2 * TensorElements()};
  std::vector<double> weight(4096), bias(4096);
  for (int64_t i = 0; i < 4096; ++i) {
    weight[i] = 0.5 + 0.001 * static_cast<double>(i % 1000);
    bias[i] = 0.25 - 0.002 * static_cast<double>(i % 1000);
  }
  spec.weight = AffineParam{{4096}, weight};
  spec.bias = AffineParam{{4096}, bias};
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_HalfLayerNormAffine)->UseManualTime();

// Reference, not a target: the 64 MiB of bf16 as 16 requests of 4 MiB,
// each normalized into its own part of Output(). Outputs under the
// streaming threshold (8 MiB) are written with ordinary stores, as most
// service requests are. Arg 0: GroupNorm (32 groups) [2, 64, 128, 128];
// 1: LayerNorm [1, 512, 4096].
void BM_HalfRequests(benchmark::State& state) {
  constexpr int64_t kRequests = 16;
  const int64_t values = 2 * TensorElements() / kRequests;
  const bool rows = state.range(0) != 0;
  Engine engine;
  NormalizeSpec spec;
  spec.mode = rows ? NormMode::kLayerNorm : NormMode::kGroupNorm;
  spec.num_groups = rows ? 0 : 32;
  spec.input = InputTensor{
      DType::kBFloat16,
      rows ? Shape{1, values / 4096, 4096} : Shape{2 * Scale(), 64, 128, 128},
      nullptr, values};
  auto* output = reinterpret_cast<uint16_t*>(Output().data());
  TimePaired(state, RunCopy, [&] {
    for (int64_t k = 0; k < kRequests; ++k) {
      NormalizeSpec request = spec;
      request.input.data = Halves().data() + k * values;
      if (!engine.Normalize(request, output + k * values).ok()) {
        state.SkipWithError("normalize failed");
      }
    }
    benchmark::ClobberMemory();
  });
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_HalfRequests)->ArgNames({"rows"})->Arg(0)->Arg(1)->UseManualTime();

// bf16 GroupNorm (32 groups) of [32, 64, 128, 128] or channels-last
// [32, 128, 128, 64]: 64 MiB, as BM_Copy.
void BM_HalfGroupNorm(benchmark::State& state) {
  const bool channels_last = state.range(0) != 0;
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kGroupNorm;
  spec.num_groups = 32;
  spec.channel_axis = channels_last ? -1 : 1;
  spec.input = InputTensor{DType::kBFloat16,
                           channels_last ? Shape{32 * Scale(), 128, 128, 64}
                                         : Shape{32 * Scale(), 64, 128, 128},
                           Halves().data(), 2 * TensorElements()};
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_HalfGroupNorm)
    ->ArgNames({"channels_last"})
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime();

// GroupNorm (32 groups) / InstanceNorm of [16, 64, 128, 128] or channels-last
// [16, 128, 128, 64].
void BM_GroupNorm(benchmark::State& state) {
  const bool instance = state.range(0) != 0;
  const bool channels_last = state.range(1) != 0;
  Engine engine;
  NormalizeSpec spec;
  spec.mode = instance ? NormMode::kInstanceNorm : NormMode::kGroupNorm;
  spec.num_groups = instance ? 0 : 32;
  spec.channel_axis = channels_last ? -1 : 1;
  spec.input = View(channels_last ? Shape{16 * Scale(), 128, 128, 64}
                                  : Shape{16 * Scale(), 64, 128, 128});
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
BENCHMARK(BM_GroupNorm)
    ->ArgNames({"instance", "channels_last"})
    ->Args({0, 0})
    ->Args({0, 1})
    ->Args({1, 0})
    ->Args({1, 1})
    ->UseManualTime();

// BatchNorm NCHW [16, 64, 128, 128] or channels-last [16, 128, 128, 64].
Shape BatchNormShape(bool channels_last) {
  return channels_last ? Shape{16 * Scale(), 128, 128, 64}
                       : Shape{16 * Scale(), 64, 128, 128};
}

// BatchNorm (eval or training, state.range(0)) of `input` with 64
// channels, and Fit.
void TimeBatchNorm(benchmark::State& state, const InputTensor& input,
                   bool channels_last) {
  Engine engine;
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = "bench";
  spec.training = state.range(0) != 0;
  spec.channel_axis = channels_last ? -1 : 1;
  spec.input = input;
  ModelSpec create;
  create.name = "bench";
  create.num_features = 64;
  if (!engine.store().Create(create).ok()) state.SkipWithError("create");
  TimeNormalize(state, engine, spec);
  SetBytes(state, TensorBytes());
}
void TimeFit(benchmark::State& state, const InputTensor& input,
             bool channels_last) {
  Engine engine;
  FitSpec spec{"bench", input, channels_last ? -1 : 1};
  TimePaired(state, RunReadSum, [&] {
    auto result = engine.Fit(spec);
    if (!result.ok()) state.SkipWithError("fit failed");
  });
  SetBytes(state, TensorBytes());
}

void BM_BatchNorm(benchmark::State& state) {
  const bool channels_last = state.range(1) != 0;
  TimeBatchNorm(state, View(BatchNormShape(channels_last)), channels_last);
}
// Eval / training x NCHW / NHWC.
void BatchNormArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"train", "channels_last"})
      ->Args({0, 0})
      ->Args({0, 1})
      ->Args({1, 0})
      ->Args({1, 1})
      ->UseManualTime();
}
BENCHMARK(BM_BatchNorm)->Apply(BatchNormArgs);

void BM_Fit(benchmark::State& state) {
  const bool channels_last = state.range(0) != 0;
  TimeFit(state, View(BatchNormShape(channels_last)), channels_last);
}
BENCHMARK(BM_Fit)->ArgNames({"channels_last"})->Arg(0)->Arg(1)->UseManualTime();

// Drift observation's cost: eval BatchNorm of a model with a drift
// reference (every request observed) timed right after the same eval of a
// model without one, as its paired baseline (see TimePaired), so that the
// ratio is of two runs a moment apart on the same data.
struct PlainEval {
  Engine* engine = nullptr;
  const NormalizeSpec* spec = nullptr;
};
PlainEval& CurrentPlainEval() {
  static PlainEval plain;
  return plain;
}
void RunPlainEval() {
  const PlainEval& plain = CurrentPlainEval();
  (void)plain.engine->Normalize(*plain.spec, Output().data());
  benchmark::ClobberMemory();
}
void TimeObservedBatchNorm(benchmark::State& state, const InputTensor& input,
                           bool channels_last) {
  Engine plain;
  Engine observed;
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = "bench";
  spec.channel_axis = channels_last ? -1 : 1;
  spec.input = input;
  // A model trained on such data: its running statistics are the input's
  // (Input(): N(3, 2) in every channel), as a served model's are, so that
  // eval's means are shift hints the observation takes.
  for (Engine* engine : {&plain, &observed}) {
    if (!engine->store()
             .Create({.name = "bench",
                      .num_features = 64,
                      .running_mean = std::vector<double>(64, 3.0),
                      .running_var = std::vector<double>(64, 4.0)})
             .ok()) {
      state.SkipWithError("create");
    }
  }
  if (!observed.store()
           .SetReference("bench", {.source = ReferenceSource::kRunning})
           .ok()) {
    state.SkipWithError("set reference");
  }
  CurrentPlainEval() = {&plain, &spec};
  TimePaired(state, RunPlainEval, [&] {
    auto result = observed.Normalize(spec, Output().data());
    if (!result.ok()) state.SkipWithError("normalize failed");
    benchmark::ClobberMemory();
  });
  SetBytes(state, TensorBytes());
}
void BM_BatchNormObserved(benchmark::State& state) {
  const bool channels_last = state.range(0) != 0;
  TimeObservedBatchNorm(state, View(BatchNormShape(channels_last)),
                        channels_last);
}
BENCHMARK(BM_BatchNormObserved)
    ->ArgNames({"channels_last"})
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime();

// bf16 BatchNorm and Fit of [32, 64, 128, 128] or channels-last
// [32, 128, 128, 64]: 64 MiB, as BM_Copy (16-bit values read in place).
InputTensor HalfBatchNormInput(bool channels_last) {
  return InputTensor{DType::kBFloat16,
                     channels_last ? Shape{32 * Scale(), 128, 128, 64}
                                   : Shape{32 * Scale(), 64, 128, 128},
                     Halves().data(), 2 * TensorElements()};
}

void BM_HalfBatchNorm(benchmark::State& state) {
  const bool channels_last = state.range(1) != 0;
  TimeBatchNorm(state, HalfBatchNormInput(channels_last), channels_last);
}
BENCHMARK(BM_HalfBatchNorm)->Apply(BatchNormArgs);

void BM_HalfFit(benchmark::State& state) {
  const bool channels_last = state.range(0) != 0;
  TimeFit(state, HalfBatchNormInput(channels_last), channels_last);
}
void BM_HalfBatchNormObserved(benchmark::State& state) {
  const bool channels_last = state.range(0) != 0;
  TimeObservedBatchNorm(state, HalfBatchNormInput(channels_last),
                        channels_last);
}
BENCHMARK(BM_HalfBatchNormObserved)
    ->ArgNames({"channels_last"})
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime();

BENCHMARK(BM_HalfFit)
    ->ArgNames({"channels_last"})
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime();

}  // namespace
}  // namespace normd

int main(int argc, char** argv) {
  if (absl::Status s = normd::RestrictSimdTargetFromEnvironment(); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
  if (const char* env = std::getenv("NORMD_BENCH_MIB")) {
    const int64_t mib = std::atoll(env);
    if (mib < 64 || mib % 64 != 0) {
      std::fprintf(stderr, "NORMD_BENCH_MIB=%s: a multiple of 64 expected\n",
                   env);
      return 2;
    }
    normd::tensor_scale = mib / 64;
  }
  benchmark::AddCustomContext("tensor_mib",
                              std::to_string(64 * normd::tensor_scale));
  int threads = 2;
  if (const char* env = std::getenv("NORMD_BENCH_THREADS")) {
    threads = std::atoi(env);
  }
  tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                            threads);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// Every kernel of the numeric core on one thread, on data that stays in the
// cache (64 K values, 128-256 KiB: L2): ns per value of the arithmetic
// alone, which memory speed does not move. Rows name the kernel, dtype and
// shape; bench/old_vs_new.py runs two builds of this program in turns and
// reports each row's median new/old ratio. Uses only the core's kernel API
// (kernels.h, moments.h, half.h), so that a baseline commit builds it too.
#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <new>
#include <random>
#include <string>
#include <vector>

#include "server/core/half.h"
#include "server/core/kernels.h"
#include "server/core/moments.h"
#if __has_include("server/core/simd/target.h")
#include "server/core/simd/target.h"
#define NORMD_HAS_SIMD_TARGET 1
#endif

namespace normd {
namespace {

constexpr int64_t kValues = 64 * 1024;

// Allocates on 64-byte lines, as the server's pooled output buffers are.
// Left to malloc, a buffer's alignment (and with it a kernel's speed: a
// misaligned vector store splits lines) would depend on each binary's
// allocation history, and so differ between the builds compared.
template <typename T>
struct LineAllocator {
  using value_type = T;
  LineAllocator() = default;
  template <typename U>
  LineAllocator(const LineAllocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(
        ::operator new (n * sizeof(T), std::align_val_t{64}));
  }
  void deallocate(T* p, size_t) { ::operator delete (p, std::align_val_t{64}); }
  bool operator==(const LineAllocator&) const = default;
};
template <typename T>
using Buffer = std::vector<T, LineAllocator<T>>;

// kValues fp32 values near 1e4 (the accuracy bar's offset).
const Buffer<float>& Floats() {
  static const auto* values = [] {
    auto* v = new Buffer<float>(kValues);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal(1e4f, 3.0f);
    for (float& x : *v) x = normal(rng);
    return v;
  }();
  return *values;
}

Buffer<double> Doubles() {
  return Buffer<double>(Floats().begin(), Floats().end());
}

// kValues 16-bit values around 2 with unit spread: a 16-bit format cannot
// hold 1e4 +- 3 apart from a handful of values (bfloat16 steps by 64 there),
// which would send every block down the exact path.
Buffer<uint16_t> Halves(DType dtype) {
  Buffer<uint16_t> h(kValues);
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(2.0f, 1.0f);
  for (uint16_t& v : h) v = FloatToHalf(dtype, normal(rng));
  return h;
}

void Report(benchmark::State& state) {
  state.counters["ns_per_value"] =
      benchmark::Counter(static_cast<double>(kValues),
                         benchmark::Counter::kIsIterationInvariantRate |
                             benchmark::Counter::kInvert);
}

constexpr DType kHalfTypes[] = {DType::kBFloat16, DType::kFloat16};
const char* Name(DType dtype) {
  return dtype == DType::kBFloat16 ? "bf16" : "f16";
}

// The 16-bit kernels: by DType in the core's API, separate functions of
// their own at a baseline commit before that (ops-inl.h came with it).
#if __has_include("server/core/simd/ops-inl.h")
std::vector<Moments> HalfChannels(DType dtype, const uint16_t* x,
                                  const ChannelLayout& layout) {
  return ChannelMoments(dtype, x, layout);
}
void HalfAffine(DType dtype, const uint16_t* x, uint16_t* y,
                const ChannelLayout& layout, const double* mean,
                const double* scale, const double* shift) {
  ChannelAffineKernel(dtype, {reinterpret_cast<const char*>(x)}, y, layout,
                      mean, scale, shift);
}
void HalfRows(DType dtype, const uint16_t* x, uint16_t* y,
              const RowLayout& rows, LayerNormStyle style, const double* weight,
              const double* bias) {
  LayerNormKernel(dtype, {reinterpret_cast<const char*>(x)}, y, rows, 1e-5,
                  style, weight, bias);
}
Moments Widened(DType dtype, const uint16_t* x, float* out, int64_t n,
                bool store) {
  return WidenedMoments(dtype, x, out, n, store);
}
#else
Moments Widened(DType dtype, const uint16_t* x, float* out, int64_t n,
                bool store) {
  return store ? WidenWithMoments(dtype, x, out, n)
               : HalfMoments(dtype, x, out, n);
}
std::vector<Moments> HalfChannels(DType dtype, const uint16_t* x,
                                  const ChannelLayout& layout) {
  return HalfChannelMoments(dtype, x, layout);
}
void HalfAffine(DType dtype, const uint16_t* x, uint16_t* y,
                const ChannelLayout& layout, const double* mean,
                const double* scale, const double* shift) {
  ChannelAffineHalfKernel(dtype, x, y, layout, mean, scale, shift);
}
void HalfRows(DType dtype, const uint16_t* x, uint16_t* y,
              const RowLayout& rows, LayerNormStyle style, const double* weight,
              const double* bias) {
  LayerNormHalfKernel(dtype, x, y, rows, 1e-5, style, weight, bias);
}
#endif

// Layouts: NCHW-like runs (inner 1024, 16384 as kernel_bench's 128 x 128
// images, and 49), channels-last (inner 1), and few channels-last channels
// (as BatchNorm1d of [N, 8] features).
ChannelLayout Layout(const std::string& name) {
  if (name == "nchw") return {8, 8, 1024};
  if (name == "nchw16k") return {2, 2, 16384};
  if (name == "nchw49") return {8, 168, 49};  // 65856 > kValues: trimmed.
  if (name == "nc8") return {8192, 8, 1};
  return {1024, 64, 1};  // nhwc
}
ChannelLayout Fitted(ChannelLayout layout) {
  while (layout.NumElements() > kValues) --layout.outer;
  return layout;
}

// The channel affine with the moments of its input in the same pass (a
// drift observation of eval BatchNorm): beside ChannelAffine* of the same
// layout, its cost over the affine alone. Not at baselines from before it.
void RegisterAffineWithMoments(const char* layout_name,
                               const ChannelLayout& layout,
                               const std::vector<double>& mean,
                               const std::vector<double>& scale,
                               const std::vector<double>& shift) {
#if __has_include("server/core/simd/affine_store-inl.h")
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    benchmark::RegisterBenchmark(
        (std::string("ChannelAffineWithMoments/") +
         (dtype == DType::kFloat32 ? "f32" : Name(dtype)) + "/" + layout_name)
            .c_str(),
        [=](auto& state) {
          const int64_t size = ElementSize(dtype);
          Buffer<char> x(kValues * size), y(kValues * size);
          if (dtype == DType::kFloat32) {
            std::copy_n(reinterpret_cast<const char*>(Floats().data()),
                        x.size(), x.data());
          } else {
            const Buffer<uint16_t> halves = Halves(dtype);
            std::copy_n(reinterpret_cast<const char*>(halves.data()), x.size(),
                        x.data());
          }
          const std::vector<double> half_mean(mean.size(), 2.0);
          const std::vector<double>& m =
              dtype == DType::kFloat32 ? mean : half_mean;
          for (auto _ : state) {
            benchmark::DoNotOptimize(
                ChannelAffineWithMoments(dtype, x.data(), y.data(), layout,
                                         m.data(), scale.data(), shift.data()));
            benchmark::ClobberMemory();
          }
          Report(state);
        });
  }
#endif
}

void RegisterAll() {
  benchmark::RegisterBenchmark("ContiguousMoments/f32", [](auto& state) {
    for (auto _ : state) {
      benchmark::DoNotOptimize(ContiguousMoments(Floats().data(), kValues));
    }
    Report(state);
  });
  benchmark::RegisterBenchmark("ContiguousMoments/f64", [](auto& state) {
    const Buffer<double> x = Doubles();
    for (auto _ : state) {
      benchmark::DoNotOptimize(ContiguousMoments(x.data(), kValues));
    }
    Report(state);
  });
  for (DType dtype : kHalfTypes) {
    benchmark::RegisterBenchmark(
        (std::string("HalfMoments/") + Name(dtype)).c_str(),
        [dtype](auto& state) {
          const Buffer<uint16_t> x = Halves(dtype);
          Buffer<float> scratch(kMomentsBlock);
          for (auto _ : state) {
            benchmark::DoNotOptimize(
                Widened(dtype, x.data(), scratch.data(), kValues, false));
          }
          Report(state);
        });
    benchmark::RegisterBenchmark(
        (std::string("WidenWithMoments/") + Name(dtype)).c_str(),
        [dtype](auto& state) {
          const Buffer<uint16_t> x = Halves(dtype);
          Buffer<float> out(kValues);
          for (auto _ : state) {
            benchmark::DoNotOptimize(
                Widened(dtype, x.data(), out.data(), kValues, true));
          }
          Report(state);
        });
    benchmark::RegisterBenchmark(
        (std::string("WidenHalf/") + Name(dtype)).c_str(),
        [dtype](auto& state) {
          const Buffer<uint16_t> x = Halves(dtype);
          Buffer<float> out(kValues);
          for (auto _ : state) {
            WidenHalf(dtype, x.data(), out.data(), kValues);
            benchmark::ClobberMemory();
          }
          Report(state);
        });
  }
  for (const char* layout_name : {"nchw", "nchw16k", "nchw49", "nhwc", "nc8"}) {
    const ChannelLayout layout = Fitted(Layout(layout_name));
    benchmark::RegisterBenchmark(
        (std::string("ChannelMoments/f32/") + layout_name).c_str(),
        [layout](auto& state) {
          for (auto _ : state) {
            benchmark::DoNotOptimize(ChannelMoments(Floats().data(), layout));
          }
          Report(state);
        });
    for (DType dtype : kHalfTypes) {
      benchmark::RegisterBenchmark(
          (std::string("HalfChannelMoments/") + Name(dtype) + "/" + layout_name)
              .c_str(),
          [layout, dtype](auto& state) {
            const Buffer<uint16_t> x = Halves(dtype);
            for (auto _ : state) {
              benchmark::DoNotOptimize(HalfChannels(dtype, x.data(), layout));
            }
            Report(state);
          });
    }
    const std::vector<double> mean(layout.channels, 1e4);
    const std::vector<double> scale(layout.channels, 0.3);
    const std::vector<double> shift(layout.channels, 0.1);
    benchmark::RegisterBenchmark(
        (std::string("ChannelAffine/f32/") + layout_name).c_str(),
        [=](auto& state) {
          Buffer<float> y(kValues);
          for (auto _ : state) {
            ChannelAffineKernel(Floats().data(), y.data(), layout, mean.data(),
                                scale.data(), shift.data());
            benchmark::ClobberMemory();
          }
          Report(state);
        });
    for (DType dtype : kHalfTypes) {
      benchmark::RegisterBenchmark(
          (std::string("ChannelAffineHalf/") + Name(dtype) + "/" + layout_name)
              .c_str(),
          [=](auto& state) {
            const Buffer<uint16_t> x = Halves(dtype);
            Buffer<uint16_t> y(kValues);
            for (auto _ : state) {
              HalfAffine(dtype, x.data(), y.data(), layout, mean.data(),
                         scale.data(), shift.data());
              benchmark::ClobberMemory();
            }
            Report(state);
          });
    }
    RegisterAffineWithMoments(layout_name, layout, mean, scale, shift);
  }
  for (int64_t row : {64, 768, 4096}) {
    const RowLayout rows{kValues / row, row};
    const std::vector<double> weight(row, 1.5), bias(row, 0.25);
    for (auto [style, style_name] :
         {std::pair{LayerNormStyle::kPyTorch, "layer"},
          std::pair{LayerNormStyle::kRms, "rms"}}) {
      benchmark::RegisterBenchmark(
          (std::string("RowNorm/f32/") + style_name + "/" + std::to_string(row))
              .c_str(),
          [=](auto& state) {
            Buffer<float> y(kValues);
            for (auto _ : state) {
              LayerNormKernel(Floats().data(), y.data(), rows, 1e-5, style,
                              weight.data(), bias.data());
              benchmark::ClobberMemory();
            }
            Report(state);
          });
      for (DType dtype : kHalfTypes) {
        benchmark::RegisterBenchmark(
            (std::string("RowNormHalf/") + Name(dtype) + "/" + style_name +
             "/" + std::to_string(row))
                .c_str(),
            [=](auto& state) {
              // y 2 KiB above x modulo 4 KiB, as separate buffers usually
              // are (where y sits just above x, rows take another path).
              const Buffer<uint16_t> halves = Halves(dtype);
              Buffer<uint16_t> both(2 * kValues + 1024);
              std::copy(halves.begin(), halves.end(), both.begin());
              const uint16_t* x = both.data();
              uint16_t* y = both.data() + kValues + 1024;
              for (auto _ : state) {
                HalfRows(dtype, x, y, rows, style, weight.data(), bias.data());
                benchmark::ClobberMemory();
              }
              Report(state);
            });
      }
    }
  }
}

}  // namespace
}  // namespace normd

int main(int argc, char** argv) {
#ifdef NORMD_HAS_SIMD_TARGET  // Baselines from before it lack it.
  if (absl::Status s = normd::RestrictSimdTargetFromEnvironment(); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 2;
  }
#endif
  tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism,
                                 1);
  normd::RegisterAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

// The normd engine: validates core requests, runs the kernels and keeps the
// model store consistent. It knows nothing of gRPC or protobuf: the RPC layer
// translates messages into the structs below and the engine's absl::Status
// codes into gRPC codes.
//
// Thread-safe: any number of threads may call it at once (the store
// serializes changes of one model; reductions run on oneTBB).
#ifndef NORMD_SERVER_CORE_ENGINE_H_
#define NORMD_SERVER_CORE_ENGINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/drift_measures.h"
#include "server/core/drift_monitor.h"
#include "server/core/kernels.h"
#include "server/core/layout.h"
#include "server/core/model.h"
#include "server/core/model_store.h"
#include "server/core/tensor.h"

namespace normd {

// A read-only tensor of any DType; `data` holds `size` elements (16-bit
// dtypes as uint16_t bits).
struct InputTensor {
  DType dtype = DType::kFloat32;
  Shape shape;
  const void* data = nullptr;
  int64_t size = 0;
  // When set, the bytes are here instead of at `data` (see
  // ReadsScatteredInPlace); must outlive the call.
  const ScatteredBytes* scattered = nullptr;
};

// `input` with scattered bytes gathered into `storage` (a copy of `input`
// if it was contiguous already).
InputTensor Contiguous(const InputTensor& input, std::vector<char>& storage);

// An affine parameter (weight or bias) as sent, converted to fp64.
struct AffineParam {
  Shape shape;
  std::vector<double> values;
};

enum class NormMode {
  kLayerNorm,
  kBatchNorm,
  kGroupNorm,     // Statistics per (sample, group of channels).
  kInstanceNorm,  // Per (sample, channel); a named model's when `model` set.
  kRmsNorm,       // Rows as LayerNorm, scaled by the root mean square.
  kL2Norm,        // Rows as LayerNorm, scaled to unit Euclidean length.
  kWeightNorm,    // PyTorch weight_norm: g * v / ||v|| per channel_axis slice.
};

// The core form of NormalizeRequest.
struct NormalizeSpec {
  NormMode mode = NormMode::kLayerNorm;
  std::string model;  // BatchNorm; InstanceNorm with running statistics.
  InputTensor input;
  bool training = false;
  std::optional<int32_t> channel_axis;
  int32_t normalized_ndim = 0;
  int64_t num_groups = 0;  // GroupNorm only.
  // Unset: the model's (BatchNorm, InstanceNorm with a model), else the
  // mode's default; WEIGHT_NORM has none.
  std::optional<double> eps;
  LayerNormStyle layer_norm_style = LayerNormStyle::kPyTorch;
  std::optional<AffineParam> weight;
  std::optional<AffineParam> bias;
};

// The core form of FitRequest.
struct FitSpec {
  std::string model;
  InputTensor input;
  std::optional<int32_t> channel_axis;
};

class Engine {
 public:
  // `max_rank`: the most dims an input, weight or bias may have (the
  // server's --max_rank); more is INVALID_ARGUMENT naming the field.
  // `drift`: how inputs of models with a drift reference are observed.
  explicit Engine(ModelStoreOptions options = {},
                  int max_rank = kDefaultMaxRank, DriftOptions drift = {});

  // Normalizes spec.input into `output` (input.size elements of input.dtype;
  // may alias the input). Returns the model after the call for BatchNorm and
  // InstanceNorm with a model, else nullopt. Every INVALID_ARGUMENT is found
  // before the store is consulted; a failed call changes nothing. 16-bit
  // inputs are computed in fp32 and rounded once at the end. Large outputs
  // are written a cache line at a time with streaming stores: give a 64-byte
  // aligned `output` (the service's BufferPool does); one that starts mid-line
  // gives the same bits, more slowly (kernel_bench BM_LayerNormUnaligned).
  absl::StatusOr<std::optional<BatchNormModel>> Normalize(
      const NormalizeSpec& spec, void* output);

  // One training step without output; returns the model after it.
  absl::StatusOr<BatchNormModel> Fit(const FitSpec& spec);

  // True when Normalize reads scattered input (InputTensor::scattered) piece
  // by piece: fp32/fp64 LayerNorm, RMSNorm and L2 rows shorter than
  // kLongLayerNormRow, and BatchNorm eval. Other calls gather scattered input
  // into one temporary buffer first; callers with a buffer pool may prefer to
  // gather it there.
  static bool ReadsScatteredInPlace(const NormalizeSpec& spec);

  // The channel count of the model a Normalize of `spec` returns (BatchNorm,
  // InstanceNorm with a model), so that a caller can size its reply before
  // the call changes anything; nullopt when it returns none or the spec is
  // malformed (the call then fails without a change).
  static std::optional<int64_t> ReturnedModelChannels(
      const NormalizeSpec& spec);

  // `model`'s drift against its reference over the observation window;
  // nullopt when it has no reference.
  std::optional<DriftReport> Drift(const BatchNormModel& model) const;

  ModelStore& store() { return store_; }
  const ModelStore& store() const { return store_; }
  DriftMonitor& drift_monitor() { return drift_; }

 private:
  // Normalize by spec.mode, for any dtype.
  absl::StatusOr<std::optional<BatchNormModel>> NormalizeByMode(
      const NormalizeSpec& spec, void* output);
  absl::Status NormalizeLayer(const NormalizeSpec& spec, void* output);
  absl::Status NormalizeWeight(const NormalizeSpec& spec, void* output);
  absl::StatusOr<BatchNormModel> NormalizeBatch(const NormalizeSpec& spec,
                                                void* output);
  absl::StatusOr<std::optional<BatchNormModel>> NormalizeGroups(
      const NormalizeSpec& spec, void* output);

  // INVALID_ARGUMENT naming the field if a tensor of `spec` has more than
  // max_rank_ dims.
  absl::Status CheckRanks(const InputTensor& input,
                          const std::optional<AffineParam>& weight,
                          const std::optional<AffineParam>& bias) const;

  // Adds an input's per-channel moments to the window of `model` when it
  // has a reference and the request is sampled; inputs with a non-finite
  // channel are not observed.
  void Observe(const BatchNormModel& model, absl::Span<const Moments> moments);
  // When `model`'s eval input (size > 0) is to be observed: normalizes it
  // into `output` (ChannelAffineKernel's arrays) and observes its moments,
  // taken in the same pass, and returns true; else does nothing and returns
  // false.
  bool NormalizeObserved(const BatchNormModel& model, const InputTensor& input,
                         const ChannelLayout& layout, const double* mean,
                         const double* scale, const double* shift,
                         void* output);
  // Adds `moments` to model `name`'s window unless a channel is not finite.
  void AddFiniteObservation(absl::string_view name,
                            absl::Span<const Moments> moments);

  ModelStore store_;
  const int max_rank_;
  DriftMonitor drift_;
};

// Per-channel moments of a batch for a training step: INVALID_ARGUMENT unless
// every channel has at least `min_per_channel` values and all are finite.
// `input` is contiguous, of any dtype (16-bit: the moments of its fp32
// widening, bit for bit).
absl::StatusOr<std::vector<Moments>> TrainingMoments(
    const InputTensor& input, const ChannelLayout& layout,
    int64_t min_per_channel);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_ENGINE_H_

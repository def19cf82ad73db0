// BatchNorm model state and the pure functions that change it. A
// BatchNormModel is a plain value: the ModelStore guards the shared copies.
#ifndef NORMD_SERVER_CORE_MODEL_H_
#define NORMD_SERVER_CORE_MODEL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/drift_reference.h"
#include "server/core/moments.h"

namespace normd {

inline constexpr double kDefaultMomentum = 0.1;
inline constexpr double kDefaultEps = 1e-5;

// What CreateModel asks for; empty arrays mean PyTorch's defaults.
struct ModelSpec {
  std::string name;
  int64_t num_features = 0;
  std::optional<double> momentum;
  bool cumulative_average = false;
  std::optional<double> eps;
  std::vector<double> running_mean;
  std::vector<double> running_var;
  std::vector<double> weight;
  std::vector<double> bias;
  int64_t num_batches_tracked = 0;
  bool use_pooled_statistics = false;
  // Sets the drift reference to the running statistics (given or default),
  // source kCheckpoint: what importing a checkpoint or a torch module asks.
  bool reference_from_running = false;
};

// A BatchNorm model: PyTorch's running statistics plus normd's exact pooled
// statistics over everything ever fitted.
struct BatchNormModel {
  std::string name;
  int64_t num_features = 0;
  double momentum = kDefaultMomentum;
  bool cumulative_average = false;
  double eps = kDefaultEps;
  bool use_pooled_statistics = false;
  int64_t num_batches_tracked = 0;
  int64_t sample_count = 0;
  std::vector<double> running_mean;
  std::vector<double> running_var;
  std::vector<double> weight;
  std::vector<double> bias;
  std::vector<Moments> pooled;  // Empty until something is fitted.
  uint64_t generation = 0;
  // What drift is measured against; none until set.
  std::optional<DriftReference> reference;

  // Pooled mean / biased variance per channel (empty when nothing fitted).
  std::vector<double> PooledMean() const;
  std::vector<double> PooledVariance() const;
};

// A model's complete state as received from outside (ImportModel, the
// source of MergeModel), not yet validated. Empty per-channel arrays in
// `config` mean PyTorch's defaults; the pooled statistics are `sample_count`
// values per channel with means `pooled_mean` and sums of squared deviations
// `pooled_m2` (or, when that is empty, `pooled_var` x sample_count).
struct ModelStateSpec {
  ModelSpec config;
  int64_t sample_count = 0;
  std::vector<double> pooled_mean;
  std::vector<double> pooled_m2;
  std::vector<double> pooled_var;
  uint64_t generation = 0;
  std::optional<DriftReference> reference;
};

// INVALID_ARGUMENT naming `field` unless `name` is 1-128 chars of
// [A-Za-z0-9._:/-].
absl::Status ValidateModelName(absl::string_view name, absl::string_view field);

// INVALID_ARGUMENT naming `field` if `name` is reserved: the Open Inference
// Protocol names its built-in stateless models layer_norm, rms_norm,
// group_norm, instance_norm, l2_norm and weight_norm, so no store model is
// created with one of them (models recovered from a state directory are
// kept whatever their name).
absl::Status CheckNotReservedModelName(absl::string_view name,
                                       absl::string_view field);

// INVALID_ARGUMENT naming `field` (and the index of a bad value) unless
// `values` has `channels` finite entries (>= 0 when `non_negative`), or is
// empty and `empty_allowed`.
absl::Status CheckChannelArray(const std::vector<double>& values,
                               int64_t channels, absl::string_view field,
                               bool non_negative = false,
                               bool empty_allowed = true);

// INVALID_ARGUMENT naming `field` unless eps is finite and > 0.
absl::Status ValidateEps(double eps, absl::string_view field);

// INVALID_ARGUMENT (naming the field) unless the spec is well formed: name,
// num_features >= 1, momentum in [0, 1], eps, array lengths 0 or C, finite
// values, running_var >= 0, num_batches_tracked >= 0. Allocates nothing.
absl::Status ValidateModelSpec(const ModelSpec& spec);

// Validates `spec` and builds the model at generation 1.
absl::StatusOr<BatchNormModel> MakeModel(const ModelSpec& spec);

// The invariants of a stored model, the one rule that decides what normd
// keeps: a valid name; num_features >= 1; momentum in [0, 1]; eps finite and
// > 0; running_mean, running_var, weight and bias of num_features finite
// values (running_var >= 0); num_batches_tracked and sample_count >= 0;
// pooled statistics empty exactly when sample_count is 0, else one per
// channel, each of sample_count values with a finite mean and a finite M2 >=
// 0; generation >= 1; a reference, if any, valid for num_features channels
// (ValidateReference). The store checks every model it takes in (created,
// imported, recovered) and the result of every change before the change is
// applied or logged, so that whatever it accepted it can always recover.
// INVALID_ARGUMENT naming the field otherwise. Allocates nothing.
absl::Status ValidateModel(const BatchNormModel& model);

// INVALID_ARGUMENT unless `state` is well formed: ValidateModelSpec's rules
// on its config; sample_count >= 0; the pooled arrays empty when
// sample_count is 0, else C finite means and C finite, non-negative M2 (or
// variances); a reference, if any, valid (ValidateReference). Messages name the
// field after `field_prefix` (e.g. "model." gives "model.running_var[2]: ...").
// Allocates nothing.
absl::Status ValidateModelState(const ModelStateSpec& state,
                                absl::string_view field_prefix);

// Validates `state` (ValidateModelState) and builds the model, at the
// state's generation (at least 1). OUT_OF_RANGE (naming the field) when the
// model it describes is not representable: pooled variances times
// sample_count past the double range.
absl::StatusOr<BatchNormModel> MakeModelFromState(
    const ModelStateSpec& state, absl::string_view field_prefix);

// Folds `source` into `into` as if source's data had also been fitted into
// it (the MergeModel rule; see normalizer.proto): pooled statistics merged
// per channel with Chan's formula, sample_count and num_batches_tracked
// added, running statistics averaged with weights num_batches_tracked (else
// sample_count, else into's kept); into's name, configuration, weight,
// bias and drift reference kept; generation += 1. FAILED_PRECONDITION, `into`
// untouched, when num_features or cumulative_average differ; OUT_OF_RANGE
// naming the counter, `into` untouched, when a count would overflow. A
// statistic that leaves the double range is not checked here: ValidateModel
// finds it.
absl::Status MergeModelStatistics(BatchNormModel& into,
                                  const BatchNormModel& source);

// A fresh model for a first Fit / training step: defaults, C channels.
BatchNormModel MakeDefaultModel(absl::string_view name, int64_t num_features);

// INVALID_ARGUMENT naming the channel unless every one of `batch` holds the
// same count m >= 1 of values with a finite mean and a finite M2 >= 0 (what
// the reductions produce; the steps below refuse anything else).
absl::Status ValidateBatchMoments(absl::Span<const Moments> batch);

// One training step with per-channel batch moments (all of one count m):
// pooled statistics merged, sample_count += m and, when m > 1, the running
// statistics updated as PyTorch does (num_batches_tracked += 1; factor
// momentum or 1/num_batches_tracked; unbiased variance). generation += 1.
// The caller has checked batch.size() == num_features. INVALID_ARGUMENT
// (ValidateBatchMoments), or OUT_OF_RANGE naming
// the counter (sample_count, num_batches_tracked, generation), `model`
// untouched, when one would overflow; statistics that leave the double range
// are left for ValidateModel to find.
absl::Status ApplyTrainingStep(BatchNormModel& model,
                               absl::Span<const Moments> batch);

// One InstanceNorm training step (PyTorch's InstanceNorm with
// track_running_stats): `pooled` holds each channel's moments over the whole
// batch (merged into the pooled statistics, sample_count += their count);
// `running_targets` holds C per-channel means of the instance means, then C
// means of the instance unbiased variances, which the running statistics
// move towards by `momentum`. num_batches_tracked is left alone, as PyTorch
// does. generation += 1. The caller has checked the channel count and that
// the model does not use cumulative_average. OUT_OF_RANGE as
// ApplyTrainingStep.
absl::Status ApplyInstanceStep(BatchNormModel& model,
                               absl::Span<const Moments> pooled,
                               absl::Span<const double> running_targets);

// Running stats back to 0 / 1, counts 0, pooled statistics cleared; config,
// weight, bias and drift reference kept; generation += 1 (OUT_OF_RANGE, `model`
// untouched, if that overflows).
absl::Status ResetStatistics(BatchNormModel& model);

// OUT_OF_RANGE naming `field` unless `value` + `add` fits an int64 / a uint64
// (both >= 0).
absl::Status CheckCounterAdd(int64_t value, int64_t add,
                             absl::string_view field);
absl::Status CheckGenerationAdd(uint64_t generation, uint64_t add);

}  // namespace normd

#endif  // NORMD_SERVER_CORE_MODEL_H_

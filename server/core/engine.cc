#include "server/core/engine.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/euclidean_norm.h"
#include "server/core/group_kernels.h"
#include "server/core/half.h"
#include "server/core/parallel.h"
#include "server/core/simd/streaming.h"
#include "server/core/thread_paths.h"

namespace normd {
namespace {

constexpr double kBertDefaultEps = 1e-6;
// F.normalize's default.
constexpr double kL2DefaultEps = 1e-12;

// INVALID_ARGUMENT naming `field` unless the parameter has shape `expected`.
absl::Status CheckAffineShape(const std::optional<AffineParam>& param,
                              absl::Span<const int64_t> expected,
                              absl::string_view field) {
  if (!param.has_value()) return absl::OkStatus();
  if (absl::Span<const int64_t>(param->shape) != expected) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".shape: ", ShapeString(param->shape), " must be ",
                     ShapeString(expected)));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> ResolveEps(std::optional<double> requested,
                                  double fallback) {
  if (!requested.has_value()) return fallback;
  if (absl::Status s = ValidateEps(*requested, "eps"); !s.ok()) return s;
  return *requested;
}

const double* ValuesOrNull(const std::optional<AffineParam>& param) {
  return param.has_value() ? param->values.data() : nullptr;
}

// Where a kernel reads `input`: in place or scattered.
InputSource SourceOf(const InputTensor& input) {
  return InputSource{static_cast<const char*>(input.data), input.scattered};
}

// INVALID_ARGUMENT naming the field a stateless L2_NORM or WEIGHT_NORM
// request must leave unset.
absl::Status CheckStatelessFields(const NormalizeSpec& spec,
                                  absl::string_view mode) {
  if (!spec.model.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model: ", mode, " is stateless; leave model empty"));
  }
  if (spec.bias.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bias: ", mode, " takes no bias"));
  }
  return absl::OkStatus();
}

// The fields L2_NORM refuses: it has no affine, and its axis is given by
// normalized_ndim (the trailing dims), never channel_axis.
absl::Status CheckL2Fields(const NormalizeSpec& spec) {
  if (absl::Status s = CheckStatelessFields(spec, "L2_NORM"); !s.ok()) {
    return s;
  }
  if (spec.weight.has_value()) {
    return absl::InvalidArgumentError(
        "weight: L2_NORM takes no weight (y = x / max(||x||, eps))");
  }
  if (spec.channel_axis.has_value()) {
    return absl::InvalidArgumentError(
        "channel_axis: L2_NORM normalizes the last normalized_ndim dims; for "
        "F.normalize(x, dim=d) move dim d last and send normalized_ndim 1");
  }
  return absl::OkStatus();
}

// INVALID_ARGUMENT naming weight.shape unless WEIGHT_NORM's g, if given,
// has shape [C] or the PyTorch parameter's shape (the input's rank, C at
// `axis`, 1 elsewhere).
absl::Status CheckGainShape(const NormalizeSpec& spec, int64_t axis) {
  if (!spec.weight.has_value()) return absl::OkStatus();
  const int64_t channels = spec.input.shape[axis];
  Shape parameter_shape(spec.input.shape.size(), 1);
  parameter_shape[axis] = channels;
  const Shape& given = spec.weight->shape;
  if (given != Shape{channels} && given != parameter_shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight.shape: ", ShapeString(given), " must be [", channels, "] or ",
        ShapeString(parameter_shape), " (g of input.shape ",
        ShapeString(spec.input.shape), " at channel_axis ", axis, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

InputTensor Contiguous(const InputTensor& input, std::vector<char>& storage) {
  InputTensor out = input;
  if (input.scattered != nullptr) {
    storage.resize(input.scattered->size());
    input.scattered->CopyOut(0, input.scattered->size(), storage.data());
    out.data = storage.data();
    out.scattered = nullptr;
  }
  return out;
}

absl::StatusOr<std::vector<Moments>> TrainingMoments(
    const InputTensor& input, const ChannelLayout& layout,
    int64_t min_per_channel) {
  if (layout.channels == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input.shape: ", ShapeString(input.shape),
                     " has 0 channels; statistics need at least one"));
  }
  if (layout.PerChannel() < min_per_channel) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input.shape: ", ShapeString(input.shape), " gives ",
        layout.PerChannel(), " value(s) per channel; ",
        min_per_channel > 1
            ? "training needs more than 1 value per channel (as PyTorch)"
            : "statistics need at least one value per channel"));
  }
  std::vector<Moments> moments =
      ChannelMoments(input.dtype, input.data, layout);
  for (size_t c = 0; c < moments.size(); ++c) {
    if (!moments[c].IsFinite()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input: channel ", c,
          " contains NaN or Inf (or overflows); Fit and training need finite "
          "values"));
    }
  }
  return moments;
}

namespace {

// `options` charging each model with a drift reference for it and for a
// window of `drift`'s buckets.
ModelStoreOptions WithDriftCharge(ModelStoreOptions options,
                                  const DriftOptions& drift) {
  options.drift_bytes_per_channel = DriftBytesPerChannel(drift.buckets);
  return options;
}

}  // namespace

Engine::Engine(ModelStoreOptions options, int max_rank, DriftOptions drift)
    : store_(WithDriftCharge(options, drift)),
      max_rank_(max_rank),
      drift_(drift) {}

absl::Status Engine::CheckRanks(const InputTensor& input,
                                const std::optional<AffineParam>& weight,
                                const std::optional<AffineParam>& bias) const {
  for (const auto& [shape, field] :
       {std::pair{&input.shape, "input.shape"},
        std::pair{weight.has_value() ? &weight->shape : nullptr,
                  "weight.shape"},
        std::pair{bias.has_value() ? &bias->shape : nullptr, "bias.shape"}}) {
    if (shape != nullptr && shape->size() > static_cast<size_t>(max_rank_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": rank ", shape->size(), " exceeds the server's limit of ",
          max_rank_, " dims (--max_rank)"));
    }
  }
  return absl::OkStatus();
}

std::optional<int64_t> Engine::ReturnedModelChannels(
    const NormalizeSpec& spec) {
  const bool returns_model =
      spec.mode == NormMode::kBatchNorm ||
      (spec.mode == NormMode::kInstanceNorm && !spec.model.empty());
  if (!returns_model) return std::nullopt;
  absl::StatusOr<ChannelLayout> layout =
      ResolveChannelAxis(spec.input.shape, spec.channel_axis);
  if (!layout.ok()) return std::nullopt;
  return layout->channels;
}

bool Engine::ReadsScatteredInPlace(const NormalizeSpec& spec) {
  if (IsHalf(spec.input.dtype)) return false;
  if (spec.mode == NormMode::kBatchNorm) return !spec.training;
  if (spec.mode != NormMode::kLayerNorm && spec.mode != NormMode::kRmsNorm &&
      spec.mode != NormMode::kL2Norm) {
    return false;
  }
  absl::StatusOr<RowLayout> rows =
      ResolveNormalizedDims(spec.input.shape, spec.normalized_ndim);
  return !rows.ok() || rows->row_size < kLongLayerNormRow;
}

absl::StatusOr<std::optional<BatchNormModel>> Engine::Normalize(
    const NormalizeSpec& spec, void* output) {
  if (absl::Status s = CheckRanks(spec.input, spec.weight, spec.bias);
      !s.ok()) {
    return s;
  }
  if (spec.input.scattered != nullptr && !ReadsScatteredInPlace(spec)) {
    std::vector<char> storage;
    NormalizeSpec gathered = spec;
    gathered.input = Contiguous(spec.input, storage);
    return Normalize(gathered, output);
  }
  if (spec.num_groups != 0 && spec.mode != NormMode::kGroupNorm) {
    return absl::InvalidArgumentError(
        "num_groups: only GROUP_NORM takes num_groups; leave it 0");
  }
  if (spec.layer_norm_style != LayerNormStyle::kPyTorch &&
      spec.mode != NormMode::kLayerNorm) {
    return absl::InvalidArgumentError(
        "layer_norm_style: only LAYER_NORM takes a style");
  }
  return NormalizeByMode(spec, output);
}

absl::StatusOr<std::optional<BatchNormModel>> Engine::NormalizeByMode(
    const NormalizeSpec& spec, void* output) {
  switch (spec.mode) {
    case NormMode::kLayerNorm:
    case NormMode::kRmsNorm:
    case NormMode::kL2Norm:
      if (absl::Status s = NormalizeLayer(spec, output); !s.ok()) return s;
      return std::nullopt;
    case NormMode::kWeightNorm:
      if (absl::Status s = NormalizeWeight(spec, output); !s.ok()) return s;
      return std::nullopt;
    case NormMode::kGroupNorm:
    case NormMode::kInstanceNorm:
      return NormalizeGroups(spec, output);
    case NormMode::kBatchNorm:
      break;
  }
  absl::StatusOr<BatchNormModel> model = NormalizeBatch(spec, output);
  if (!model.ok()) return model.status();
  return std::optional<BatchNormModel>(*std::move(model));
}

absl::Status Engine::NormalizeLayer(const NormalizeSpec& spec, void* output) {
  const InputTensor& in = spec.input;
  const bool l2 = spec.mode == NormMode::kL2Norm;
  if (l2) {
    if (absl::Status s = CheckL2Fields(spec); !s.ok()) return s;
  }
  absl::StatusOr<RowLayout> rows =
      ResolveNormalizedDims(in.shape, spec.normalized_ndim);
  if (!rows.ok()) return rows.status();
  const bool bert = spec.layer_norm_style == LayerNormStyle::kBertUnbiasedStd;
  absl::StatusOr<double> eps = ResolveEps(spec.eps, l2     ? kL2DefaultEps
                                                    : bert ? kBertDefaultEps
                                                           : kDefaultEps);
  if (!eps.ok()) return eps.status();
  const LayerNormStyle style = spec.mode == NormMode::kRmsNorm
                                   ? LayerNormStyle::kRms
                               : l2 ? LayerNormStyle::kL2
                                    : spec.layer_norm_style;
  const int32_t k = spec.normalized_ndim == 0 ? 1 : spec.normalized_ndim;
  const auto normalized_dims =
      absl::Span<const int64_t>(in.shape).subspan(in.shape.size() - k);
  for (const auto& [param, field] :
       {std::pair{&spec.weight, "weight"}, std::pair{&spec.bias, "bias"}}) {
    if (absl::Status s = CheckAffineShape(*param, normalized_dims, field);
        !s.ok()) {
      return s;
    }
  }
  if (in.size == 0) return absl::OkStatus();
  LayerNormKernel(in.dtype, SourceOf(in), output, *rows, *eps, style,
                  ValuesOrNull(spec.weight), ValuesOrNull(spec.bias));
  return absl::OkStatus();
}

absl::StatusOr<BatchNormModel> Engine::NormalizeBatch(const NormalizeSpec& spec,
                                                      void* output) {
  const InputTensor& in = spec.input;
  if (absl::Status s = ValidateModelName(spec.model, "model"); !s.ok()) {
    return s;
  }
  absl::StatusOr<ChannelLayout> layout =
      ResolveChannelAxis(in.shape, spec.channel_axis);
  if (!layout.ok()) return layout.status();
  if (spec.eps.has_value()) {
    if (absl::Status s = ValidateEps(*spec.eps, "eps"); !s.ok()) return s;
  }
  const int64_t channels = layout->channels;
  for (const auto& [param, field] :
       {std::pair{&spec.weight, "weight"}, std::pair{&spec.bias, "bias"}}) {
    if (absl::Status s = CheckAffineShape(*param, {channels}, field); !s.ok()) {
      return s;
    }
  }

  // Statistics to normalize with, and the model after the call.
  std::vector<double> mean;
  std::vector<double> var;
  absl::StatusOr<BatchNormModel> model;
  if (spec.training) {
    absl::StatusOr<std::vector<Moments>> batch =
        TrainingMoments(in, *layout, /*min_per_channel=*/2);
    if (!batch.ok()) return batch.status();
    model = store_.Train(spec.model, *batch);
    if (!model.ok()) return model.status();
    Observe(*model, *batch);
    for (const Moments& m : *batch) {
      mean.push_back(m.mean);
      var.push_back(m.BiasedVariance());
    }
  } else {
    model = store_.GetForEval(spec.model, channels);
    if (!model.ok()) return model.status();
    if (model->use_pooled_statistics) {
      if (model->pooled.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", spec.model,
            "' uses pooled statistics but nothing has been fitted yet"));
      }
      mean = model->PooledMean();
      var = model->PooledVariance();
    } else {
      mean = model->running_mean;
      var = model->running_var;
    }
  }

  const double eps = spec.eps.value_or(model->eps);
  const std::vector<double>& weight =
      spec.weight.has_value() ? spec.weight->values : model->weight;
  const std::vector<double>& bias =
      spec.bias.has_value() ? spec.bias->values : model->bias;
  std::vector<double> scale(channels);
  for (int64_t c = 0; c < channels; ++c) {
    scale[c] = weight[c] / std::sqrt(var[c] + eps);
  }
  if (in.size == 0) return model;
  if (!spec.training && NormalizeObserved(*model, in, *layout, mean.data(),
                                          scale.data(), bias.data(), output)) {
    return model;
  }
  // Contiguous, or scattered fp32 / fp64 (ReadsScatteredInPlace).
  ChannelAffineKernel(in.dtype, SourceOf(in), output, *layout, mean.data(),
                      scale.data(), bias.data());
  return model;
}

absl::Status Engine::NormalizeWeight(const NormalizeSpec& spec, void* output) {
  const InputTensor& in = spec.input;
  if (absl::Status s = CheckStatelessFields(spec, "WEIGHT_NORM"); !s.ok()) {
    return s;
  }
  if (spec.eps.has_value()) {
    return absl::InvalidArgumentError(
        "eps: WEIGHT_NORM has none (PyTorch's weight_norm divides by the norm "
        "itself); leave it unset");
  }
  if (spec.normalized_ndim != 0) {
    return absl::InvalidArgumentError(
        "normalized_ndim: WEIGHT_NORM takes channel_axis (PyTorch's dim), not "
        "normalized_ndim; leave it 0");
  }
  absl::StatusOr<int64_t> axis =
      ResolveWeightNormAxis(in.shape, spec.channel_axis);
  if (!axis.ok()) return axis.status();
  if (absl::Status s = CheckGainShape(spec, *axis); !s.ok()) return s;
  const ChannelLayout layout = LayoutAround(in.shape, *axis);
  if (in.size == 0) return absl::OkStatus();
  const std::vector<Moments> moments =
      ChannelMoments(in.dtype, in.data, layout);
  std::vector<double> norms(layout.channels);
  ParallelFor(tbb::blocked_range<int64_t>(0, layout.channels, 1),
              layout.channels, [&](const tbb::blocked_range<int64_t>& range) {
                for (int64_t c = range.begin(); c < range.end(); ++c) {
                  norms[c] =
                      EuclideanNorm(moments[c], in.dtype, in.data, layout, c);
                }
              });
  // Without g, PyTorch's initial g = ||v||: the output is v.
  const std::vector<double>& gains =
      spec.weight.has_value() ? spec.weight->values : norms;
  // w = v * (g / ||v||), as PyTorch: the shift -0 keeps v's signed zeros
  // (x * s + -0 is x * s exactly), and a zero or non-finite norm gives
  // PyTorch's NaN (0 / 0, Inf / Inf).
  std::vector<double> scale(layout.channels);
  for (int64_t c = 0; c < layout.channels; ++c) {
    scale[c] = gains[c] / norms[c];
  }
  const std::vector<double> zero(layout.channels, 0.0);
  const std::vector<double> minus_zero(layout.channels, -0.0);
  ChannelAffineKernel(in.dtype, SourceOf(in), output, layout, zero.data(),
                      scale.data(), minus_zero.data());
  return absl::OkStatus();
}

namespace {

// From per-(sample, channel) moments of an InstanceNorm training batch: each
// channel's moments over the batch, and the targets of the running
// statistics (ModelStore::TrainInstance). INVALID_ARGUMENT for non-finite
// input.
absl::Status InstanceStep(absl::Span<const Moments> moments,
                          const GroupGeometry& g, std::vector<Moments>& pooled,
                          std::vector<double>& targets) {
  const int64_t channels = g.layout.channels;
  pooled.assign(channels, Moments{});
  targets.assign(2 * channels, 0.0);
  for (int64_t n = 0; n < g.samples; ++n) {
    for (int64_t c = 0; c < channels; ++c) {
      const Moments& m = moments[n * channels + c];
      if (!m.IsFinite()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "input: sample ", n, " channel ", c,
            " contains NaN or Inf (or overflows); training needs finite "
            "values"));
      }
      MergeMoments(pooled[c], m);
      targets[c] += m.mean;
      targets[channels + c] += m.UnbiasedVariance();
    }
  }
  for (double& t : targets) t /= static_cast<double>(g.samples);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<BatchNormModel>> Engine::NormalizeGroups(
    const NormalizeSpec& spec, void* output) {
  const InputTensor& in = spec.input;
  const bool instance = spec.mode == NormMode::kInstanceNorm;
  const bool with_model = instance && !spec.model.empty();
  if (with_model) {
    if (absl::Status s = ValidateModelName(spec.model, "model"); !s.ok()) {
      return s;
    }
  } else if (!spec.model.empty()) {
    return absl::InvalidArgumentError(
        "model: GROUP_NORM is stateless; leave model empty");
  }
  absl::StatusOr<ChannelLayout> layout =
      ResolveChannelAxis(in.shape, spec.channel_axis);
  if (!layout.ok()) return layout.status();
  const int64_t channels = layout->channels;
  int64_t groups = channels;
  if (!instance) {
    if (spec.num_groups < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("num_groups: must be at least 1 for GROUP_NORM, got ",
                       spec.num_groups));
    }
    if (channels % spec.num_groups != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "num_groups: ", spec.num_groups, " does not divide the ", channels,
          " channels of input.shape ", ShapeString(in.shape)));
    }
    groups = spec.num_groups;
  }
  if (spec.eps.has_value()) {
    if (absl::Status s = ValidateEps(*spec.eps, "eps"); !s.ok()) return s;
  }
  for (const auto& [param, field] :
       {std::pair{&spec.weight, "weight"}, std::pair{&spec.bias, "bias"}}) {
    if (absl::Status s = CheckAffineShape(*param, {channels}, field); !s.ok()) {
      return s;
    }
  }
  if (with_model && !spec.training) {  // Eval: the model's running stats.
    absl::StatusOr<BatchNormModel> model = NormalizeBatch(spec, output);
    if (!model.ok()) return model.status();
    return std::optional<BatchNormModel>(*std::move(model));
  }

  // Statistics of the input itself. Sizes from the shape, which may be empty:
  // the layout of one sample gives the dims between batch and channel axes.
  Shape one_sample = in.shape;
  one_sample[0] = 1;
  absl::StatusOr<ChannelLayout> sample =
      ResolveChannelAxis(one_sample, spec.channel_axis);
  if (!sample.ok()) return sample.status();  // Valid as in.shape was.
  const GroupGeometry g{*layout, in.shape[0], groups, sample->outer};
  const int64_t spatial = g.sample_outer * layout->inner;
  if (instance && spatial == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input.shape: ", ShapeString(in.shape),
        " has 1 spatial value per (sample, channel); InstanceNorm needs more "
        "than 1 (as PyTorch)"));
  }
  if (!instance && g.samples * g.ChannelsPerGroup() * spatial == 1) {
    // PyTorch 1.13's own rule: it refuses only this case and gives bias for
    // other groups of one value (N > 1), as normd does.
    return absl::InvalidArgumentError(absl::StrCat(
        "input.shape: ", ShapeString(in.shape),
        " is one sample with 1 value per group; GroupNorm needs more than 1 "
        "value (as PyTorch)"));
  }
  if (in.size == 0) {
    if (with_model) {
      return absl::InvalidArgumentError(
          absl::StrCat("input.shape: ", ShapeString(in.shape),
                       " has no values; training needs at least one value "
                       "per channel"));
    }
    return std::optional<BatchNormModel>();
  }
  const std::vector<double> no_weight(channels, 1.0);
  const std::vector<double> no_bias(channels, 0.0);
  // Stateless with groups of contiguous rows: each is reduced and written
  // while cached. With larger samples and a large enough batch: one sample
  // per task, reduced then written backwards.
  bool fused_samples = false;
  if (!with_model && g.sample_outer != 1) {
    fused_samples = g.samples >= kFusedSamplesPerThread * ComputeConcurrency();
    CountThreadPath(fused_samples ? ThreadPath::kGroupSamplesFused
                                  : ThreadPath::kGroupSamplesTwoPass);
  }
  if (!with_model && (g.sample_outer == 1 || fused_samples)) {
    const std::vector<double>& weight =
        spec.weight.has_value() ? spec.weight->values : no_weight;
    const std::vector<double>& bias =
        spec.bias.has_value() ? spec.bias->values : no_bias;
    const double eps = spec.eps.value_or(kDefaultEps);
    if (g.sample_outer == 1) {
      FusedGroupRows(in.dtype, in.data, output, g, weight, bias, eps);
    } else {
      FusedGroupSamples(in.dtype, in.data, output, g, weight, bias, eps);
    }
    return std::optional<BatchNormModel>();
  }
  const std::vector<Moments> moments = GroupMoments(in.dtype, in.data, g);

  std::optional<BatchNormModel> model;
  if (with_model) {
    std::vector<Moments> pooled;
    std::vector<double> targets;
    if (absl::Status s = InstanceStep(moments, g, pooled, targets); !s.ok()) {
      return s;
    }
    absl::StatusOr<BatchNormModel> trained =
        store_.TrainInstance(spec.model, pooled, targets);
    if (!trained.ok()) return trained.status();
    model = *std::move(trained);
  }
  const double eps =
      spec.eps.value_or(model.has_value() ? model->eps : kDefaultEps);
  const std::vector<double>& weight = spec.weight.has_value()
                                          ? spec.weight->values
                                      : model.has_value() ? model->weight
                                                          : no_weight;
  const std::vector<double>& bias = spec.bias.has_value() ? spec.bias->values
                                    : model.has_value()   ? model->bias
                                                          : no_bias;
  std::vector<double> mean(g.samples * channels);
  std::vector<double> scale(mean.size());
  std::vector<double> shift(mean.size());
  GroupParams(moments.data(), 0, g.samples * groups, g, weight, bias, eps,
              mean.data(), scale.data(), shift.data());
  SampleChannelAffine(in.dtype, in.data, output, g, mean.data(), scale.data(),
                      shift.data());
  return model;
}

absl::StatusOr<BatchNormModel> Engine::Fit(const FitSpec& spec) {
  if (absl::Status s = CheckRanks(spec.input, std::nullopt, std::nullopt);
      !s.ok()) {
    return s;
  }
  if (spec.input.scattered != nullptr) {
    std::vector<char> storage;
    FitSpec gathered = spec;
    gathered.input = Contiguous(spec.input, storage);
    return Fit(gathered);
  }
  if (absl::Status s = ValidateModelName(spec.model, "model"); !s.ok()) {
    return s;
  }
  absl::StatusOr<ChannelLayout> layout =
      ResolveChannelAxis(spec.input.shape, spec.channel_axis);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<std::vector<Moments>> batch =
      TrainingMoments(spec.input, *layout, /*min_per_channel=*/1);
  if (!batch.ok()) return batch.status();
  absl::StatusOr<BatchNormModel> model = store_.Train(spec.model, *batch);
  if (model.ok()) Observe(*model, *batch);
  return model;
}

}  // namespace normd

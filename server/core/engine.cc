#include "server/core/engine.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace normd {
namespace {

constexpr double kBertDefaultEps = 1e-6;

// Calls f with a null pointer of the element type of `dtype`.
template <typename F>
decltype(auto) VisitDType(DType dtype, F&& f) {
  if (dtype == DType::kFloat32) return f(static_cast<float*>(nullptr));
  return f(static_cast<double*>(nullptr));
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

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

// `input` with scattered bytes gathered into `storage` (a copy of `input`
// if it was contiguous already).
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

template <typename T>
InputSource<T> SourceOf(const InputTensor& input) {
  return InputSource<T>{static_cast<const T*>(input.data), input.scattered};
}

}  // namespace

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
  std::vector<Moments> moments = VisitDType(input.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    return ChannelMoments(static_cast<const T*>(input.data), layout);
  });
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

Engine::Engine(ModelStoreOptions options) : store_(options) {}

bool Engine::ReadsScatteredInPlace(const NormalizeSpec& spec) {
  if (spec.mode == NormMode::kBatchNorm) return !spec.training;
  absl::StatusOr<RowLayout> rows =
      ResolveNormalizedDims(spec.input.shape, spec.normalized_ndim);
  return !rows.ok() || rows->row_size < kLongLayerNormRow;
}

absl::StatusOr<std::optional<BatchNormModel>> Engine::Normalize(
    const NormalizeSpec& spec, void* output) {
  if (spec.input.scattered != nullptr && !ReadsScatteredInPlace(spec)) {
    std::vector<char> storage;
    NormalizeSpec gathered = spec;
    gathered.input = Contiguous(spec.input, storage);
    return Normalize(gathered, output);
  }
  if (spec.mode == NormMode::kLayerNorm) {
    if (absl::Status s = NormalizeLayer(spec, output); !s.ok()) return s;
    return std::nullopt;
  }
  absl::StatusOr<BatchNormModel> model = NormalizeBatch(spec, output);
  if (!model.ok()) return model.status();
  return std::optional<BatchNormModel>(*std::move(model));
}

absl::Status Engine::NormalizeLayer(const NormalizeSpec& spec, void* output) {
  const InputTensor& in = spec.input;
  absl::StatusOr<RowLayout> rows =
      ResolveNormalizedDims(in.shape, spec.normalized_ndim);
  if (!rows.ok()) return rows.status();
  const bool bert = spec.layer_norm_style == LayerNormStyle::kBertUnbiasedStd;
  absl::StatusOr<double> eps =
      ResolveEps(spec.eps, bert ? kBertDefaultEps : kDefaultEps);
  if (!eps.ok()) return eps.status();
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
  VisitDType(in.dtype, [&](auto* type) {
    using T = std::remove_pointer_t<decltype(type)>;
    LayerNormKernel(SourceOf<T>(in), static_cast<T*>(output), *rows, *eps,
                    spec.layer_norm_style, ValuesOrNull(spec.weight),
                    ValuesOrNull(spec.bias));
  });
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
  if (in.size > 0) {
    VisitDType(in.dtype, [&](auto* type) {
      using T = std::remove_pointer_t<decltype(type)>;
      ChannelAffineKernel(SourceOf<T>(in), static_cast<T*>(output), *layout,
                          mean.data(), scale.data(), bias.data());
    });
  }
  return model;
}

absl::StatusOr<BatchNormModel> Engine::Fit(const FitSpec& spec) {
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
  return store_.Train(spec.model, *batch);
}

}  // namespace normd

#include "server/rpc/convert.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace normd {
namespace {

absl::StatusOr<DType> ParseDType(v1::DataType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DATA_TYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::FLOAT64:
      return DType::kFloat64;
    case v1::BFLOAT16:
    case v1::FLOAT16:
      return absl::UnimplementedError(
          absl::StrCat(field, ".dtype: ", v1::DataType_Name(dtype),
                       " is not supported yet; send FLOAT32 or FLOAT64"));
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: unknown DataType value ", static_cast<int>(dtype)));
  }
}

std::string ShapeString(const v1::Tensor& tensor) {
  return absl::StrCat("[", absl::StrJoin(tensor.shape(), ","), "]");
}

// Parses an optional affine parameter (weight / bias) into fp64 values.
absl::Status ParseAffine(const v1::Tensor& tensor, absl::string_view field,
                         std::optional<AffineParam>& out) {
  ParsedTensor parsed;
  if (absl::Status s = ParseTensor(tensor, field, parsed); !s.ok()) return s;
  AffineParam param;
  param.shape = parsed.view.shape;
  param.values.resize(parsed.view.size);
  if (parsed.view.dtype == DType::kFloat32) {
    const auto* src = static_cast<const float*>(parsed.view.data);
    for (int64_t i = 0; i < parsed.view.size; ++i) param.values[i] = src[i];
  } else if (parsed.view.size > 0) {
    std::memcpy(param.values.data(), parsed.view.data,
                parsed.view.size * sizeof(double));
  }
  out = std::move(param);
  return absl::OkStatus();
}

absl::StatusOr<NormMode> ParseMode(v1::Mode mode) {
  switch (mode) {
    case v1::LAYER_NORM:
      return NormMode::kLayerNorm;
    case v1::BATCH_NORM:
      return NormMode::kBatchNorm;
    case v1::MODE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "mode: must be set (LAYER_NORM or BATCH_NORM)");
    case v1::GROUP_NORM:
    case v1::INSTANCE_NORM:
    case v1::RMS_NORM:
      return absl::UnimplementedError(absl::StrCat(
          "mode: ", v1::Mode_Name(mode), " is not implemented yet"));
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: unknown Mode value ", static_cast<int>(mode)));
  }
}

absl::StatusOr<LayerNormStyle> ParseStyle(v1::LayerNormStyle style) {
  switch (style) {
    case v1::LAYER_NORM_STYLE_UNSPECIFIED:
    case v1::PYTORCH:
      return LayerNormStyle::kPyTorch;
    case v1::BERT_UNBIASED_STD:
      return LayerNormStyle::kBertUnbiasedStd;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layer_norm_style: unknown LayerNormStyle value ",
                       static_cast<int>(style)));
  }
}

}  // namespace

absl::Status ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                         ParsedTensor& out) {
  absl::StatusOr<DType> dtype = ParseDType(tensor.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<int64_t> count =
      NumElements(tensor.shape(), absl::StrCat(field, ".shape"));
  if (!count.ok()) return count.status();
  const bool has_data = !tensor.data().empty();
  const bool has_values = tensor.values_size() > 0;
  if (has_data && has_values) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set exactly one of data and values, not both"));
  }
  if (*count == 0 && (has_data || has_values)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", ShapeString(tensor),
        " has zero elements, so neither data nor values may be set"));
  }
  if (*count > 0 && !has_data && !has_values) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeString(tensor), " has ", *count,
                     " elements but neither data nor values is set"));
  }
  out.view.dtype = *dtype;
  out.view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  out.view.size = *count;
  out.values_form = has_values;
  const int64_t element_size = ElementSize(*dtype);
  if (has_values) {
    if (tensor.values_size() != *count) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".values: has ", tensor.values_size(), " values but shape ",
          ShapeString(tensor), " needs ", *count));
    }
    if (*dtype == DType::kFloat32) {
      out.storage_f32.assign(tensor.values().begin(), tensor.values().end());
      out.view.data = out.storage_f32.data();
    } else {
      out.storage.assign(tensor.values().begin(), tensor.values().end());
      out.view.data = out.storage.data();
    }
    return absl::OkStatus();
  }
  const std::string& bytes = tensor.data();
  if (static_cast<int64_t>(bytes.size()) != *count * element_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".data: has ", bytes.size(), " bytes but shape ",
                     ShapeString(tensor), " of ", DTypeName(*dtype), " needs ",
                     *count * element_size));
  }
  if (reinterpret_cast<uintptr_t>(bytes.data()) % element_size == 0) {
    out.view.data = bytes.data();
  } else {
    // Rare (short strings): copy to aligned storage.
    out.storage.resize((bytes.size() + sizeof(double) - 1) / sizeof(double));
    std::memcpy(out.storage.data(), bytes.data(), bytes.size());
    out.view.data = out.storage.data();
  }
  return absl::OkStatus();
}

absl::Status ParseNormalizeRequest(const v1::NormalizeRequest& request,
                                   ParsedNormalize& out) {
  absl::StatusOr<NormMode> mode = ParseMode(request.mode());
  if (!mode.ok()) return mode.status();
  absl::StatusOr<LayerNormStyle> style = ParseStyle(request.layer_norm_style());
  if (!style.ok()) return style.status();
  if (absl::Status s = ParseTensor(request.input(), "input", out.input);
      !s.ok()) {
    return s;
  }
  NormalizeSpec& spec = out.spec;
  spec.mode = *mode;
  spec.layer_norm_style = *style;
  spec.model = request.model();
  spec.input = out.input.view;
  spec.training = request.training();
  if (request.has_channel_axis()) spec.channel_axis = request.channel_axis();
  spec.normalized_ndim = request.normalized_ndim();
  if (request.has_eps()) spec.eps = request.eps();
  if (request.has_weight()) {
    if (absl::Status s = ParseAffine(request.weight(), "weight", spec.weight);
        !s.ok()) {
      return s;
    }
  }
  if (request.has_bias()) {
    if (absl::Status s = ParseAffine(request.bias(), "bias", spec.bias);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseFitRequest(const v1::FitRequest& request, ParsedFit& out) {
  if (absl::Status s = ParseTensor(request.input(), "input", out.input);
      !s.ok()) {
    return s;
  }
  out.spec.model = request.model();
  out.spec.input = out.input.view;
  if (request.has_channel_axis()) {
    out.spec.channel_axis = request.channel_axis();
  }
  return absl::OkStatus();
}

ModelSpec ToModelSpec(const v1::CreateModelRequest& request) {
  ModelSpec spec;
  spec.name = request.name();
  spec.num_features = request.num_features();
  if (request.has_momentum()) spec.momentum = request.momentum();
  spec.cumulative_average = request.cumulative_average();
  if (request.has_eps()) spec.eps = request.eps();
  spec.running_mean.assign(request.running_mean().begin(),
                           request.running_mean().end());
  spec.running_var.assign(request.running_var().begin(),
                          request.running_var().end());
  spec.weight.assign(request.weight().begin(), request.weight().end());
  spec.bias.assign(request.bias().begin(), request.bias().end());
  spec.num_batches_tracked = request.num_batches_tracked();
  spec.use_pooled_statistics = request.use_pooled_statistics();
  return spec;
}

void ToModelState(const BatchNormModel& model, bool with_arrays,
                  v1::ModelState& state) {
  state.set_name(model.name);
  state.set_num_features(model.num_features);
  state.set_momentum(model.momentum);
  state.set_cumulative_average(model.cumulative_average);
  state.set_eps(model.eps);
  state.set_use_pooled_statistics(model.use_pooled_statistics);
  state.set_num_batches_tracked(model.num_batches_tracked);
  state.set_sample_count(model.sample_count);
  state.set_generation(model.generation);
  if (!with_arrays) return;
  state.mutable_running_mean()->Assign(model.running_mean.begin(),
                                       model.running_mean.end());
  state.mutable_running_var()->Assign(model.running_var.begin(),
                                      model.running_var.end());
  state.mutable_weight()->Assign(model.weight.begin(), model.weight.end());
  state.mutable_bias()->Assign(model.bias.begin(), model.bias.end());
  for (const Moments& m : model.pooled) {
    state.add_mean(m.mean);
    state.add_var(m.BiasedVariance());
  }
}

void* PrepareOutput(const v1::Tensor& request_tensor, const ParsedTensor& input,
                    std::vector<double>& scratch, v1::Tensor& out) {
  out.set_dtype(request_tensor.dtype());
  *out.mutable_shape() = request_tensor.shape();
  if (input.values_form) {
    // Big enough for size elements of either dtype, and double-aligned.
    scratch.resize(input.view.size);
    return scratch.data();
  }
  std::string* bytes = out.mutable_data();
  bytes->resize(input.view.size * ElementSize(input.view.dtype));
  return bytes->data();
}

void CopyValuesOutput(const ParsedTensor& input,
                      const std::vector<double>& scratch, v1::Tensor& out) {
  if (!input.values_form) return;
  auto* values = out.mutable_values();
  if (input.view.dtype == DType::kFloat64) {
    values->Assign(scratch.begin(), scratch.end());
    return;
  }
  const auto* floats = reinterpret_cast<const float*>(scratch.data());
  values->Reserve(static_cast<int>(input.view.size));
  for (int64_t i = 0; i < input.view.size; ++i) values->Add(floats[i]);
}

}  // namespace normd

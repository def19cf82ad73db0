#include "client/checkpoint/layer_values.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace normd::client {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

double HalfBitsToDouble(uint16_t bits) {
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) {
    return mantissa == 0 ? sign * HUGE_VAL : std::nan("");
  }
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

double BFloat16BitsToDouble(uint16_t bits) {
  const uint32_t widened = uint32_t{bits} << 16;
  float value;
  std::memcpy(&value, &widened, sizeof(value));
  return value;
}

int64_t ElementBytes(FloatKind kind) {
  switch (kind) {
    case FloatKind::kFloat32:
      return 4;
    case FloatKind::kFloat64:
      return 8;
    default:
      return 2;
  }
}

double SixteenBitsToDouble(FloatKind kind, uint16_t bits) {
  return kind == FloatKind::kFloat16 ? HalfBitsToDouble(bits)
                                     : BFloat16BitsToDouble(bits);
}

double WidenElement(FloatKind kind, const char* bytes, int64_t index) {
  const char* at = bytes + index * ElementBytes(kind);
  switch (kind) {
    case FloatKind::kFloat32:
      return LoadLittleEndian<float>(at);
    case FloatKind::kFloat64:
      return LoadLittleEndian<double>(at);
    default:
      return SixteenBitsToDouble(kind, LoadLittleEndian<uint16_t>(at));
  }
}

absl::Status CheckLayer(const CheckpointLayer& layer,
                        absl::string_view file_name) {
  const size_t channels = layer.running_mean.values.size();
  const auto fail = [&](const LayerTensor& tensor, auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": layer '", layer.layer, "': tensor '",
                     tensor.source, "' ", parts...));
  };
  for (const LayerTensor* tensor :
       {&layer.running_mean, &layer.running_var, &layer.weight, &layer.bias}) {
    const bool optional = tensor == &layer.weight || tensor == &layer.bias;
    if (optional && tensor->source.empty()) continue;
    if (tensor->values.size() != channels || channels == 0) {
      return fail(*tensor, "has ", tensor->values.size(), " values but '",
                  layer.running_mean.source, "' has ", channels,
                  ": a layer's tensors must agree on C >= 1");
    }
    for (size_t c = 0; c < channels; ++c) {
      const double value = tensor->values[c];
      if (!std::isfinite(value)) {
        return fail(*tensor, "has ", value, " at [", c,
                    "]: statistics must be finite");
      }
      if (tensor == &layer.running_var && value < 0) {
        return fail(*tensor, "has ", value, " at [", c,
                    "]: a variance must be >= 0");
      }
    }
  }
  if (layer.num_batches_tracked < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_name, ": layer '", layer.layer, "': num_batches_tracked is ",
        layer.num_batches_tracked, ", below 0"));
  }
  return absl::OkStatus();
}

}  // namespace normd::client

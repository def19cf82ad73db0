#include "client/tensor_io.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace normd::client {
namespace {

std::vector<absl::string_view> SplitList(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  if (!text.empty() && text.front() == '[' && text.back() == ']') {
    text = text.substr(1, text.size() - 2);
  }
  std::vector<absl::string_view> parts;
  for (absl::string_view part :
       absl::StrSplit(text, absl::ByAnyChar(", "), absl::SkipWhitespace())) {
    parts.push_back(part);
  }
  return parts;
}

std::string FormatNumber(double v) { return absl::StrFormat("%.6g", v); }

void FormatLevel(const std::vector<double>& values,
                 const google::protobuf::RepeatedField<int64_t>& shape, int dim,
                 int64_t& index, int64_t max_elements, std::string& out) {
  if (dim == shape.size()) {
    if (index < max_elements) {
      out += FormatNumber(values[index]);
    } else if (index == max_elements) {
      out += "...";
    }
    ++index;
    return;
  }
  out += "[";
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (index > max_elements) break;
    if (i > 0)
      out += dim + 1 == shape.size() ? ", " : ",\n" + std::string(dim + 1, ' ');
    FormatLevel(values, shape, dim + 1, index, max_elements, out);
  }
  out += "]";
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text,
                                                absl::string_view field) {
  std::vector<int64_t> shape;
  for (absl::string_view part : SplitList(text)) {
    int64_t dim;
    if (!absl::SimpleAtoi(part, &dim)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", part, "' is not an integer"));
    }
    shape.push_back(dim);
  }
  return shape;
}

absl::StatusOr<std::vector<double>> ParseValues(absl::string_view text,
                                                absl::string_view field) {
  std::vector<double> values;
  for (absl::string_view part : SplitList(text)) {
    double v;
    if (!absl::SimpleAtod(part, &v)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": '", part, "' is not a number"));
    }
    values.push_back(v);
  }
  return values;
}

absl::StatusOr<v1::DataType> ParseDataType(absl::string_view text) {
  const std::string lower = absl::AsciiStrToLower(text);
  if (lower == "float32" || lower == "f32" || lower == "float") {
    return v1::FLOAT32;
  }
  if (lower == "float64" || lower == "f64" || lower == "double") {
    return v1::FLOAT64;
  }
  if (lower == "bfloat16") return v1::BFLOAT16;
  if (lower == "float16") return v1::FLOAT16;
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype: '", text, "' is not one of float32, float64, bfloat16, float16"));
}

namespace {

// A 16-bit binary floating-point format: bfloat16 (8 exponent bits, 7
// mantissa bits) or IEEE binary16 (5, 10).
struct HalfFormat {
  int exponent_bits;
  int mantissa_bits;
  int Bias() const { return (1 << (exponent_bits - 1)) - 1; }
  uint16_t Infinity() const {
    return static_cast<uint16_t>(((1 << exponent_bits) - 1) << mantissa_bits);
  }
};

std::optional<HalfFormat> HalfFormatOf(v1::DataType dtype) {
  if (dtype == v1::BFLOAT16) return HalfFormat{8, 7};
  if (dtype == v1::FLOAT16) return HalfFormat{5, 10};
  return std::nullopt;
}

// v rounded to nearest (ties to even) in `f`, by scaling to an integer
// mantissa exactly and rounding that once.
uint16_t EncodeHalf(double v, HalfFormat f) {
  if (std::isnan(v)) {
    return static_cast<uint16_t>(f.Infinity() | (1 << (f.mantissa_bits - 1)));
  }
  const uint16_t sign = std::signbit(v) ? 0x8000 : 0;
  const double a = std::fabs(v);
  const int min_exponent = 1 - f.Bias();  // Of the smallest normal.
  int exponent;
  std::frexp(a, &exponent);
  exponent = std::max(exponent - 1, min_exponent);  // a = m 2^exponent.
  double mantissa = std::nearbyint(std::ldexp(a, f.mantissa_bits - exponent));
  if (mantissa == std::ldexp(1.0, f.mantissa_bits + 1)) {  // Rounded up.
    mantissa /= 2;
    exponent += 1;
  }
  if (exponent > f.Bias() || std::isinf(a)) return sign | f.Infinity();
  const auto m = static_cast<uint32_t>(mantissa);
  const bool normal = m >> f.mantissa_bits;  // Else subnormal (or zero).
  const uint32_t biased = normal ? exponent + f.Bias() : 0;
  return static_cast<uint16_t>(sign | biased << f.mantissa_bits |
                               (m & ((1u << f.mantissa_bits) - 1)));
}

double DecodeHalf(uint16_t h, HalfFormat f) {
  const int exponent = (h & 0x7fff) >> f.mantissa_bits;
  const int mantissa = h & ((1 << f.mantissa_bits) - 1);
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == (1 << f.exponent_bits) - 1) {
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  }
  if (exponent == 0) {
    return sign * std::ldexp(mantissa, 1 - f.Bias() - f.mantissa_bits);
  }
  return sign * std::ldexp((1 << f.mantissa_bits) + mantissa,
                           exponent - f.Bias() - f.mantissa_bits);
}

}  // namespace

v1::Tensor MakeTensor(const std::vector<int64_t>& shape,
                      const std::vector<double>& values, v1::DataType dtype) {
  std::string bytes;
  if (std::optional<HalfFormat> half = HalfFormatOf(dtype)) {
    bytes.resize(values.size() * 2);
    for (size_t i = 0; i < values.size(); ++i) {
      const uint16_t h = EncodeHalf(values[i], *half);
      bytes[2 * i] = static_cast<char>(h & 0xff);
      bytes[2 * i + 1] = static_cast<char>(h >> 8);
    }
  } else if (dtype == v1::FLOAT64) {
    bytes.resize(values.size() * sizeof(double));
    if (!values.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  } else {
    std::vector<float> floats(values.begin(), values.end());
    bytes.resize(floats.size() * sizeof(float));
    if (!floats.empty()) std::memcpy(bytes.data(), floats.data(), bytes.size());
  }
  return MakeRawTensor(shape, std::move(bytes), dtype);
}

v1::Tensor MakeRawTensor(const std::vector<int64_t>& shape, std::string bytes,
                         v1::DataType dtype) {
  v1::Tensor tensor;
  tensor.set_dtype(dtype);
  tensor.mutable_shape()->Assign(shape.begin(), shape.end());
  if (!bytes.empty()) tensor.set_data(std::move(bytes));
  return tensor;
}

absl::StatusOr<std::vector<double>> TensorValues(const v1::Tensor& tensor) {
  if (tensor.values_size() > 0) {
    return std::vector<double>(tensor.values().begin(), tensor.values().end());
  }
  const std::string& bytes = tensor.data();
  std::vector<double> out;
  if (tensor.dtype() == v1::FLOAT64) {
    if (bytes.size() % sizeof(double) != 0) {
      return absl::InvalidArgumentError("data: not a whole number of float64");
    }
    out.resize(bytes.size() / sizeof(double));
    std::memcpy(out.data(), bytes.data(), bytes.size());
  } else if (tensor.dtype() == v1::FLOAT32 ||
             tensor.dtype() == v1::DATA_TYPE_UNSPECIFIED) {
    if (bytes.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError("data: not a whole number of float32");
    }
    std::vector<float> floats(bytes.size() / sizeof(float));
    std::memcpy(floats.data(), bytes.data(), bytes.size());
    out.assign(floats.begin(), floats.end());
  } else if (std::optional<HalfFormat> half = HalfFormatOf(tensor.dtype())) {
    if (bytes.size() % 2 != 0) {
      return absl::InvalidArgumentError(
          "data: not a whole number of 16-bit elements");
    }
    out.resize(bytes.size() / 2);
    for (size_t i = 0; i < out.size(); ++i) {
      const auto lo = static_cast<uint8_t>(bytes[2 * i]);
      const auto hi = static_cast<uint8_t>(bytes[2 * i + 1]);
      out[i] = DecodeHalf(static_cast<uint16_t>(lo | hi << 8), *half);
    }
  } else {
    return absl::UnimplementedError(
        absl::StrCat("dtype ", v1::DataType_Name(tensor.dtype()),
                     " cannot be decoded by this client"));
  }
  int64_t expected = 1;
  for (int64_t d : tensor.shape()) expected *= d;
  if (static_cast<int64_t>(out.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor has ", out.size(), " elements, shape needs ", expected));
  }
  return out;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status WriteFile(const std::string& path, absl::string_view bytes) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot write (",
                     errno != 0 ? std::strerror(errno) : "write failed", ")"));
  }
  return absl::OkStatus();
}

std::string FormatTensor(const v1::Tensor& tensor, int64_t max_elements) {
  absl::StatusOr<std::vector<double>> values = TensorValues(tensor);
  if (!values.ok()) return absl::StrCat("<", values.status().message(), ">");
  if (tensor.shape().empty()) {
    return values->empty() ? "[]" : FormatNumber((*values)[0]);
  }
  std::string out;
  int64_t index = 0;
  FormatLevel(*values, tensor.shape(), 0, index, max_elements, out);
  return out;
}

std::string FormatList(const google::protobuf::RepeatedField<double>& values) {
  std::string out = "[";
  for (int i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += FormatNumber(values[i]);
  }
  return out + "]";
}

}  // namespace normd::client

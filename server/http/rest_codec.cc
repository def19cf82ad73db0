#include "server/http/rest_codec.h"

#include <simdjson.h>

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/half.h"
#include "server/rpc/oip_convert.h"
#include "server/rpc/status_mapping.h"

namespace normd {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw tensor bytes are little-endian");

namespace dom = simdjson::dom;
using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

const char* JsonKind(const dom::element& e) {
  switch (e.type()) {
    case dom::element_type::ARRAY:
      return "an array";
    case dom::element_type::OBJECT:
      return "an object";
    case dom::element_type::INT64:
    case dom::element_type::UINT64:
      return "an integer";
    case dom::element_type::DOUBLE:
      return "a number";
    case dom::element_type::STRING:
      return "a string";
    case dom::element_type::BOOL:
      return "a bool";
    case dom::element_type::NULL_VALUE:
      break;
  }
  return "null";
}

absl::Status WrongJsonType(absl::string_view field, absl::string_view want,
                           const dom::element& e) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": must be ", want, ", got ", JsonKind(e)));
}

// The members of a JSON object, each key at most once, none but `known`.
absl::Status ForEachMember(
    const dom::element& e, absl::string_view field,
    std::initializer_list<absl::string_view> known,
    const std::function<absl::Status(absl::string_view, dom::element)>& fn) {
  dom::object object;
  if (e.get_object().get(object) != simdjson::SUCCESS) {
    return WrongJsonType(field, "an object", e);
  }
  std::vector<absl::string_view> seen;
  for (const dom::key_value_pair member : object) {
    const absl::string_view key(member.key.data(), member.key.size());
    const std::string where =
        field.empty() ? std::string(key) : absl::StrCat(field, ".", key);
    for (absl::string_view earlier : seen) {
      if (earlier == key) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": given twice"));
      }
    }
    seen.push_back(key);
    bool is_known = known.size() == 0;
    for (absl::string_view k : known) is_known = is_known || k == key;
    if (!is_known) {
      return absl::InvalidArgumentError(
          absl::StrCat(field.empty() ? "body" : field, ": unknown key ",
                       QuotedForMessage(key)));
    }
    if (absl::Status s = fn(key, member.value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A JSON parameter value as an InferParameter: true/false a bool, an integer
// an int64, any other number a double, a string a string.
absl::Status ToInferParameter(const dom::element& e, absl::string_view field,
                              InferParameter& p) {
  switch (e.type()) {
    case dom::element_type::BOOL:
      p.set_bool_param(e.get_bool().value_unsafe());
      return absl::OkStatus();
    case dom::element_type::INT64:
      p.set_int64_param(e.get_int64().value_unsafe());
      return absl::OkStatus();
    case dom::element_type::DOUBLE:
      p.set_double_param(e.get_double().value_unsafe());
      return absl::OkStatus();
    case dom::element_type::STRING: {
      const std::string_view s = e.get_string().value_unsafe();
      p.set_string_param(std::string(s));
      return absl::OkStatus();
    }
    case dom::element_type::UINT64:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", e.get_uint64().value_unsafe(), " is out of range"));
    default:
      return WrongJsonType(field, "a bool, a number or a string", e);
  }
}

// The parameters object into `parameters`, but `extension` (a parameter of
// the binary-data extension), which goes to `extension_value`.
absl::Status ReadParameters(
    const dom::element& e, absl::string_view field,
    google::protobuf::Map<std::string, InferParameter>& parameters,
    absl::string_view extension, std::optional<dom::element>& extension_value) {
  return ForEachMember(
      e, field, {}, [&](absl::string_view key, dom::element value) {
        if (key == extension) {
          extension_value = value;
          return absl::OkStatus();
        }
        return ToInferParameter(value, absl::StrCat(field, ".", key),
                                parameters[std::string(key)]);
      });
}

absl::StatusOr<bool> ReadBool(const dom::element& e, absl::string_view field) {
  bool value = false;
  if (e.get_bool().get(value) != simdjson::SUCCESS) {
    return WrongJsonType(field, "a bool", e);
  }
  return value;
}

// Bytes of one element of `dtype`.
size_t ElementBytes(v1::DataType dtype) {
  return dtype == v1::FLOAT64 ? 8 : dtype == v1::FLOAT32 ? 4 : 2;
}

// Reads the elements of an input's "data" as `dtype` bytes.
class DataReader {
 public:
  DataReader(std::string field, v1::DataType dtype, std::string& out)
      : field_(std::move(field)), dtype_(dtype), out_(out) {}

  // `data` flat (numbers) or nested as `shape` (arrays of arrays, one level
  // per dimension, each of its dimension's length).
  absl::Status Read(const dom::element& data,
                    const google::protobuf::RepeatedField<int64_t>& shape) {
    dom::array top;
    if (data.get_array().get(top) != simdjson::SUCCESS) {
      return WrongJsonType(field_, "an array", data);
    }
    const bool nested = top.size() > 0 && (*top.begin()).is_array();
    if (!nested) {
      std::optional<int64_t> count = ElementCount(shape);
      if (count.has_value() && *count != static_cast<int64_t>(top.size())) {
        return absl::InvalidArgumentError(
            absl::StrCat(field_, ": ", top.size(), " values; shape ",
                         ShapeText(shape), " has ", *count));
      }
      out_.reserve(top.size() * ElementBytes(dtype_));
      return ReadLevel(top, shape, -1);
    }
    out_.reserve(std::max<int64_t>(ElementCount(shape).value_or(0), 0) *
                 ElementBytes(dtype_));
    return ReadLevel(top, shape, 0);
  }

 private:
  static std::optional<int64_t> ElementCount(
      const google::protobuf::RepeatedField<int64_t>& shape) {
    int64_t count = 1;
    for (int64_t dim : shape) {
      if (dim < 0 ||
          (dim > 0 && count > std::numeric_limits<int64_t>::max() / dim)) {
        return std::nullopt;  // The OIP translation names the shape.
      }
      count *= dim;
    }
    return count;
  }

  static std::string ShapeText(
      const google::protobuf::RepeatedField<int64_t>& shape) {
    std::string text = "[";
    for (int i = 0; i < shape.size(); ++i) {
      absl::StrAppend(&text, i > 0 ? ", " : "", shape[i]);
    }
    return text + "]";
  }

  std::string Where() const {
    std::string where = field_;
    for (size_t index : path_) absl::StrAppend(&where, "[", index, "]");
    return where;
  }

  // The array at nesting `level` (-1: flat data, any length).
  absl::Status ReadLevel(const dom::array& array,
                         const google::protobuf::RepeatedField<int64_t>& shape,
                         int level) {
    if (level >= 0) {
      if (level >= shape.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), ": nested deeper than the shape ", ShapeText(shape)));
      }
      if (static_cast<int64_t>(array.size()) != shape[level]) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), ": ", array.size(), " entries; dimension ", level,
            " of shape ", ShapeText(shape), " is ", shape[level]));
      }
    }
    const bool leaf = level < 0 || level == shape.size() - 1;
    path_.push_back(0);
    for (const dom::element e : array) {
      if (leaf) {
        if (absl::Status s = AppendNumber(e); !s.ok()) return s;
      } else {
        dom::array inner;
        if (e.get_array().get(inner) != simdjson::SUCCESS) {
          return WrongJsonType(Where(), "an array (nested data)", e);
        }
        if (absl::Status s = ReadLevel(inner, shape, level + 1); !s.ok()) {
          return s;
        }
      }
      ++path_.back();
    }
    path_.pop_back();
    return absl::OkStatus();
  }

  absl::Status AppendNumber(const dom::element& e) {
    double value = 0;
    if (e.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), ": nested deeper than the shape"));
    }
    if (e.get_double().get(value) != simdjson::SUCCESS) {
      return WrongJsonType(Where(), "a number", e);
    }
    switch (dtype_) {
      case v1::FLOAT64:
        return Append(value);
      case v1::FLOAT32: {
        const float f = static_cast<float>(value);
        if (!std::isfinite(f)) return NotFinite(value, "FP32");
        return Append(f);
      }
      default: {
        const DType half =
            dtype_ == v1::FLOAT16 ? DType::kFloat16 : DType::kBFloat16;
        const uint16_t h = DoubleToHalf(half, value);
        if (!std::isfinite(HalfToFloat(half, h))) {
          return NotFinite(value, dtype_ == v1::FLOAT16 ? "FP16" : "BF16");
        }
        return Append(h);
      }
    }
  }

  template <typename T>
  absl::Status Append(T value) {
    char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    out_.append(bytes, sizeof(T));
    return absl::OkStatus();
  }

  absl::Status NotFinite(double value, const char* datatype) const {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), ": ", value, " is not finite as ", datatype));
  }

  const std::string field_;
  const v1::DataType dtype_;
  std::string& out_;
  std::vector<size_t> path_;
};

// The body's JSON part and its binary part.
absl::Status SplitBody(absl::string_view body,
                       std::optional<absl::string_view> header_length,
                       absl::string_view& json, absl::string_view& binary) {
  json = body;
  binary = absl::string_view();
  if (!header_length.has_value()) return absl::OkStatus();
  uint64_t length = 0;
  if (!absl::SimpleAtoi(*header_length, &length) || length > body.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kInferenceHeaderContentLength, ": ", QuotedForMessage(*header_length),
        " is not a length within the body's ", body.size(), " bytes"));
  }
  json = body.substr(0, length);
  binary = body.substr(length);
  return absl::OkStatus();
}

// One element of "inputs".
absl::Status ReadInput(const dom::element& e, int index,
                       absl::string_view& binary, ModelInferRequest& message) {
  const std::string field = absl::StrCat("inputs[", index, "]");
  ModelInferRequest::InferInputTensor& input = *message.add_inputs();
  std::string& bytes = *message.add_raw_input_contents();
  std::optional<dom::element> data;
  std::optional<dom::element> binary_size;
  absl::Status status = ForEachMember(
      e, field, {"name", "shape", "datatype", "parameters", "data"},
      [&](absl::string_view key, dom::element value) -> absl::Status {
        const std::string where = absl::StrCat(field, ".", key);
        if (key == "name" || key == "datatype") {
          std::string_view text;
          if (value.get_string().get(text) != simdjson::SUCCESS) {
            return WrongJsonType(where, "a string", value);
          }
          (key == "name" ? *input.mutable_name() : *input.mutable_datatype()) =
              std::string(text);
        } else if (key == "shape") {
          dom::array dims;
          if (value.get_array().get(dims) != simdjson::SUCCESS) {
            return WrongJsonType(where, "an array of integers", value);
          }
          for (const dom::element dim : dims) {
            int64_t d = 0;
            if (dim.get_int64().get(d) != simdjson::SUCCESS) {
              return WrongJsonType(where, "an array of integers", dim);
            }
            input.add_shape(d);
          }
        } else if (key == "parameters") {
          return ReadParameters(value, where, *input.mutable_parameters(),
                                "binary_data_size", binary_size);
        } else {
          data = value;
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  if (data.has_value() == binary_size.has_value()) {
    return absl::InvalidArgumentError(
        data.has_value()
            ? absl::StrCat(field,
                           ": both data and parameters.binary_data_size; "
                           "give the elements one way")
            : absl::StrCat(field,
                           ".data: required (or "
                           "parameters.binary_data_size with the "
                           "bytes after the JSON)"));
  }
  if (binary_size.has_value()) {
    const std::string where =
        absl::StrCat(field, ".parameters.binary_data_size");
    int64_t size = 0;
    if (binary_size->get_int64().get(size) != simdjson::SUCCESS || size < 0) {
      return WrongJsonType(where, "a byte count", *binary_size);
    }
    if (static_cast<uint64_t>(size) > binary.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", size, " bytes, but only ", binary.size(),
                       " bytes of binary data are left in the body"));
    }
    bytes.assign(binary.data(), static_cast<size_t>(size));
    binary.remove_prefix(static_cast<size_t>(size));
    return absl::OkStatus();
  }
  const std::optional<v1::DataType> dtype = OipDatatype(input.datatype());
  if (!dtype.has_value()) return absl::OkStatus();  // OIP names the datatype.
  return DataReader(absl::StrCat(field, ".data"), *dtype, bytes)
      .Read(*data, input.shape());
}

// One element of "outputs"; sets `binary` when it asks for binary data.
absl::Status ReadOutput(const dom::element& e, int index,
                        ModelInferRequest& message,
                        std::optional<bool>& binary) {
  const std::string field = absl::StrCat("outputs[", index, "]");
  ModelInferRequest::InferRequestedOutputTensor& output =
      *message.add_outputs();
  std::optional<dom::element> binary_data;
  absl::Status status = ForEachMember(
      e, field, {"name", "parameters"},
      [&](absl::string_view key, dom::element value) -> absl::Status {
        const std::string where = absl::StrCat(field, ".", key);
        if (key == "name") {
          std::string_view text;
          if (value.get_string().get(text) != simdjson::SUCCESS) {
            return WrongJsonType(where, "a string", value);
          }
          output.set_name(std::string(text));
          return absl::OkStatus();
        }
        return ReadParameters(value, where, *output.mutable_parameters(),
                              "binary_data", binary_data);
      });
  if (!status.ok() || !binary_data.has_value()) return status;
  absl::StatusOr<bool> value =
      ReadBool(*binary_data, absl::StrCat(field, ".parameters.binary_data"));
  if (!value.ok()) return value.status();
  binary = *value;
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRestInferRequest(
    absl::string_view body, std::optional<absl::string_view> header_length,
    absl::string_view model, absl::string_view version,
    RestInferRequest& request) {
  absl::string_view json;
  absl::string_view binary;
  if (absl::Status s = SplitBody(body, header_length, json, binary); !s.ok()) {
    return s;
  }
  dom::parser parser;
  dom::element root;
  if (const simdjson::error_code error =
          parser.parse(json.data(), json.size()).get(root);
      error != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "body: malformed JSON (", simdjson::error_message(error), ")"));
  }
  ModelInferRequest& message = request.message;
  message.set_model_name(std::string(model));
  message.set_model_version(std::string(version));
  std::optional<dom::element> binary_output_all;
  std::optional<bool> binary_output;
  bool has_inputs = false;
  absl::Status status = ForEachMember(
      root, "", {"id", "parameters", "inputs", "outputs"},
      [&](absl::string_view key, dom::element value) -> absl::Status {
        if (key == "id") {
          std::string_view id;
          if (value.get_string().get(id) != simdjson::SUCCESS) {
            return WrongJsonType("id", "a string", value);
          }
          message.set_id(std::string(id));
          return absl::OkStatus();
        }
        if (key == "parameters") {
          return ReadParameters(value, "parameters",
                                *message.mutable_parameters(),
                                "binary_data_output", binary_output_all);
        }
        dom::array array;
        if (value.get_array().get(array) != simdjson::SUCCESS) {
          return WrongJsonType(key, "an array of objects", value);
        }
        int index = 0;
        for (const dom::element e : array) {
          absl::Status s = key == "inputs"
                               ? ReadInput(e, index, binary, message)
                               : ReadOutput(e, index, message, binary_output);
          if (!s.ok()) return s;
          ++index;
        }
        has_inputs = has_inputs || key == "inputs";
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  if (!has_inputs) {
    return absl::InvalidArgumentError("inputs: required");
  }
  if (!binary.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("body: ", binary.size(),
                     " bytes of binary data after the JSON that no input's "
                     "parameters.binary_data_size claims"));
  }
  request.binary_output = false;
  if (binary_output_all.has_value()) {
    absl::StatusOr<bool> all =
        ReadBool(*binary_output_all, "parameters.binary_data_output");
    if (!all.ok()) return all.status();
    request.binary_output = *all;
  }
  if (binary_output.has_value()) request.binary_output = *binary_output;
  return absl::OkStatus();
}

void AppendJsonString(absl::string_view text, std::string& out) {
  out.push_back('"');
  for (const char c : text) {
    switch (c) {
      case '"':
        out.append("\\\"");
        break;
      case '\\':
        out.append("\\\\");
        break;
      case '\n':
        out.append("\\n");
        break;
      case '\r':
        out.append("\\r");
        break;
      case '\t':
        out.append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          constexpr char kHex[] = "0123456789abcdef";
          out.append("\\u00");
          out.push_back(kHex[(c >> 4) & 0xf]);
          out.push_back(kHex[c & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

namespace {

// The shortest decimal that reads back as `value`; NaN and the infinities
// as Python's json writes them (JSON has no such numbers).
template <typename T>
void AppendJsonNumber(T value, std::string& out) {
  if (!std::isfinite(value)) {
    out.append(std::isnan(value) ? "NaN"
               : value > 0       ? "Infinity"
                                 : "-Infinity");
    return;
  }
  char buffer[32];
  const std::to_chars_result end =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, end.ptr);
}

void AppendShape(const google::protobuf::RepeatedField<int64_t>& shape,
                 std::string& out) {
  out.push_back('[');
  for (int i = 0; i < shape.size(); ++i) {
    if (i > 0) out.push_back(',');
    absl::StrAppend(&out, shape[i]);
  }
  out.push_back(']');
}

void AppendParameters(
    const google::protobuf::Map<std::string, InferParameter>& parameters,
    std::string& out) {
  // In name order, so that a body is the same every time.
  std::vector<const std::string*> names;
  for (const auto& [name, value] : parameters) names.push_back(&name);
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  out.push_back('{');
  for (const std::string* name : names) {
    if (name != names.front()) out.push_back(',');
    AppendJsonString(*name, out);
    out.push_back(':');
    const InferParameter& p = parameters.at(*name);
    switch (p.parameter_choice_case()) {
      case InferParameter::kBoolParam:
        out.append(p.bool_param() ? "true" : "false");
        break;
      case InferParameter::kInt64Param:
        absl::StrAppend(&out, p.int64_param());
        break;
      case InferParameter::kDoubleParam:
        AppendJsonNumber(p.double_param(), out);
        break;
      case InferParameter::kStringParam:
        AppendJsonString(p.string_param(), out);
        break;
      case InferParameter::PARAMETER_CHOICE_NOT_SET:
        out.append("null");
        break;
    }
  }
  out.push_back('}');
}

// Raw little-endian elements of `datatype` as a flat JSON array.
void AppendJsonData(absl::string_view datatype, absl::string_view bytes,
                    std::string& out) {
  const std::optional<v1::DataType> dtype = OipDatatype(datatype);
  const v1::DataType type = dtype.value_or(v1::FLOAT32);
  const size_t size = ElementBytes(type);
  const size_t count = bytes.size() / size;
  out.reserve(out.size() + count * 16 + 2);
  out.push_back('[');
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) out.push_back(',');
    const char* p = bytes.data() + i * size;
    if (type == v1::FLOAT64) {
      double v;
      std::memcpy(&v, p, sizeof(v));
      AppendJsonNumber(v, out);
    } else if (type == v1::FLOAT32) {
      float v;
      std::memcpy(&v, p, sizeof(v));
      AppendJsonNumber(v, out);
    } else {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      AppendJsonNumber(
          HalfToFloat(type == v1::FLOAT16 ? DType::kFloat16 : DType::kBFloat16,
                      h),
          out);
    }
  }
  out.push_back(']');
}

}  // namespace

void FormatRestInferResponse(ModelInferResponse& response, bool binary_output,
                             RestBody& body) {
  std::string& out = body.bytes;
  out.clear();
  out.append("{\"model_name\":");
  AppendJsonString(response.model_name(), out);
  out.append(",\"model_version\":");
  AppendJsonString(response.model_version(), out);
  if (!response.id().empty()) {
    out.append(",\"id\":");
    AppendJsonString(response.id(), out);
  }
  if (!response.parameters().empty()) {
    out.append(",\"parameters\":");
    AppendParameters(response.parameters(), out);
  }
  out.append(",\"outputs\":[");
  std::string binary;
  for (int i = 0; i < response.outputs_size(); ++i) {
    const ModelInferResponse::InferOutputTensor& output = response.outputs(i);
    std::string empty;
    std::string& raw = i < response.raw_output_contents_size()
                           ? *response.mutable_raw_output_contents(i)
                           : empty;
    if (i > 0) out.push_back(',');
    out.append("{\"name\":");
    AppendJsonString(output.name(), out);
    out.append(",\"datatype\":");
    AppendJsonString(output.datatype(), out);
    out.append(",\"shape\":");
    AppendShape(output.shape(), out);
    if (binary_output) {
      absl::StrAppend(
          &out, ",\"parameters\":{\"binary_data_size\":", raw.size(), "}}");
      if (binary.empty()) {
        binary.swap(raw);
      } else {
        binary.append(raw);
      }
    } else {
      out.append(",\"data\":");
      AppendJsonData(output.datatype(), raw, out);
      out.push_back('}');
    }
  }
  out.append("]}");
  body.json_bytes.reset();
  if (binary_output) {
    body.json_bytes = out.size();
    out.append(binary);
  }
}

std::string ServerMetadataJson(
    const inference::ServerMetadataResponse& response) {
  std::string out = "{\"name\":";
  AppendJsonString(response.name(), out);
  out.append(",\"version\":");
  AppendJsonString(response.version(), out);
  out.append(",\"extensions\":[");
  for (int i = 0; i < response.extensions_size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(response.extensions(i), out);
  }
  out.append("]}");
  return out;
}

std::string ModelMetadataJson(
    const inference::ModelMetadataResponse& response) {
  std::string out = "{\"name\":";
  AppendJsonString(response.name(), out);
  out.append(",\"versions\":[");
  for (int i = 0; i < response.versions_size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(response.versions(i), out);
  }
  out.append("],\"platform\":");
  AppendJsonString(response.platform(), out);
  auto tensors = [&out](const char* key, const auto& list) {
    absl::StrAppend(&out, ",\"", key, "\":[");
    for (int i = 0; i < list.size(); ++i) {
      if (i > 0) out.push_back(',');
      out.append("{\"name\":");
      AppendJsonString(list[i].name(), out);
      out.append(",\"datatype\":");
      AppendJsonString(list[i].datatype(), out);
      out.append(",\"shape\":");
      AppendShape(list[i].shape(), out);
      out.push_back('}');
    }
    out.push_back(']');
  };
  tensors("inputs", response.inputs());
  tensors("outputs", response.outputs());
  out.push_back('}');
  return out;
}

std::string ModelReadyJson(absl::string_view name, bool ready) {
  std::string out = "{\"name\":";
  AppendJsonString(name, out);
  absl::StrAppend(&out, ",\"ready\":", ready ? "true" : "false", "}");
  return out;
}

std::string HealthJson(absl::string_view key, bool value) {
  std::string out = "{";
  AppendJsonString(key, out);
  absl::StrAppend(&out, ":", value ? "true" : "false", "}");
  return out;
}

std::string ErrorJson(absl::string_view message) {
  std::string out = "{\"error\":";
  AppendJsonString(message, out);
  out.push_back('}');
  return out;
}

}  // namespace normd

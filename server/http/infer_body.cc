#include "server/http/infer_body.h"

#include <simdjson.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/core/half.h"
#include "server/service/oip_models.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

static_assert(std::endian::native == std::endian::little,
              "raw tensor bytes are little-endian");

namespace dom = simdjson::dom;

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

// The number of elements of `array`: simdjson's count stops at 2^24 - 1,
// past which they are counted one by one.
size_t CountElements(const dom::array& array) {
  constexpr size_t kSaturated = 0xFFFFFF;
  const size_t size = array.size();
  if (size < kSaturated) return size;
  size_t count = 0;
  for (auto it = array.begin(); it != array.end(); ++it) ++count;
  return count;
}

// The members of a JSON object, each key at most once, none but `known`
// (any when empty). Linear in the members: the first few keys are compared
// one by one, past them a hash set finds a repeat.
absl::Status ForEachMember(
    const dom::element& e, absl::string_view field,
    std::initializer_list<absl::string_view> known,
    absl::FunctionRef<absl::Status(absl::string_view, dom::element)> fn) {
  dom::object object;
  if (e.get_object().get(object) != simdjson::SUCCESS) {
    return WrongJsonType(field.empty() ? "body" : field, "an object", e);
  }
  constexpr size_t kComparedKeys = 8;
  absl::InlinedVector<absl::string_view, kComparedKeys> first_keys;
  absl::flat_hash_set<absl::string_view> more_keys;
  for (const dom::key_value_pair member : object) {
    const absl::string_view key(member.key.data(), member.key.size());
    bool repeated = false;
    if (first_keys.size() < kComparedKeys) {
      repeated = std::find(first_keys.begin(), first_keys.end(), key) !=
                 first_keys.end();
      if (!repeated) first_keys.push_back(key);
    } else {
      if (more_keys.empty())
        more_keys.insert(first_keys.begin(), first_keys.end());
      repeated = !more_keys.insert(key).second;
    }
    if (repeated) {
      return absl::InvalidArgumentError(absl::StrCat(
          field.empty() ? std::string(key) : absl::StrCat(field, ".", key),
          ": given twice"));
    }
    if (known.size() > 0 &&
        std::find(known.begin(), known.end(), key) == known.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field.empty() ? "body" : field, ": unknown key ",
                       QuotedForMessage(key)));
    }
    if (absl::Status s = fn(key, member.value); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// A JSON parameter value: true/false a bool, an integer an int64, any other
// number a double, a string a string.
absl::StatusOr<InferValue> ToInferValue(const dom::element& e,
                                        absl::string_view field) {
  switch (e.type()) {
    case dom::element_type::BOOL:
      return InferValue(e.get_bool().value_unsafe());
    case dom::element_type::INT64:
      return InferValue(e.get_int64().value_unsafe());
    case dom::element_type::DOUBLE:
      return InferValue(e.get_double().value_unsafe());
    case dom::element_type::STRING:
      return InferValue(std::string(e.get_string().value_unsafe()));
    case dom::element_type::UINT64:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": ", e.get_uint64().value_unsafe(), " is out of range"));
    default:
      return WrongJsonType(field, "a bool, a number or a string", e);
  }
}

// A parameters object into `parameters`, but `extension` (a parameter of
// the binary-data extension, which the REST front end reads itself), which
// goes to `extension_value`.
absl::Status ReadParameters(const dom::element& e, absl::string_view field,
                            InferParameters& parameters,
                            absl::string_view extension,
                            std::optional<dom::element>& extension_value) {
  return ForEachMember(
      e, field, {}, [&](absl::string_view key, dom::element value) {
        if (key == extension) {
          extension_value = value;
          return absl::OkStatus();
        }
        absl::StatusOr<InferValue> v =
            ToInferValue(value, absl::StrCat(field, ".", key));
        if (!v.ok()) return v.status();
        parameters.push_back({std::string(key), *std::move(v)});
        return absl::OkStatus();
      });
}

absl::StatusOr<bool> ReadBool(const dom::element& e, absl::string_view field) {
  bool value = false;
  if (e.get_bool().get(value) != simdjson::SUCCESS) {
    return WrongJsonType(field, "a bool", e);
  }
  return value;
}

absl::Status ReadString(const dom::element& e, absl::string_view field,
                        std::string& out) {
  std::string_view text;
  if (e.get_string().get(text) != simdjson::SUCCESS) {
    return WrongJsonType(field, "a string", e);
  }
  out = std::string(text);
  return absl::OkStatus();
}

// Reads the elements of an input's "data" as raw bytes of `dtype`.
class DataReader {
 public:
  DataReader(std::string field, DType dtype, const Shape& shape,
             int64_t elements, std::vector<char>& out)
      : field_(std::move(field)),
        dtype_(dtype),
        shape_(shape),
        elements_(elements),
        out_(out) {}

  // `data` flat (numbers) or nested as the shape (arrays of arrays, one
  // level per dimension, each of its dimension's length).
  absl::Status Read(const dom::element& data, size_t json_bytes) {
    dom::array top;
    if (data.get_array().get(top) != simdjson::SUCCESS) {
      return WrongJsonType(field_, "an array", data);
    }
    // Never sized by the shape alone: a JSON value takes at least two
    // bytes, so the body bounds how many there can be.
    const int64_t most_values = static_cast<int64_t>(json_bytes / 2 + 1);
    out_.resize(static_cast<size_t>(std::min(elements_, most_values) *
                                    ElementSize(dtype_)));
    written_ = 0;
    const bool nested = top.begin() != top.end() && (*top.begin()).is_array();
    if (!nested) {
      const size_t count = CountElements(top);
      if (static_cast<int64_t>(count) != elements_) {
        return absl::InvalidArgumentError(
            absl::StrCat(field_, ": ", count, " values; shape ",
                         ShapeString(shape_), " has ", elements_));
      }
      return Finish(ReadLevel(top, -1));
    }
    return Finish(ReadLevel(top, 0));
  }

 private:
  std::string Where() const {
    std::string where = field_;
    for (size_t index : path_) absl::StrAppend(&where, "[", index, "]");
    return where;
  }

  // The array at nesting `level` (-1: flat data of the right length).
  absl::Status ReadLevel(const dom::array& array, int level) {
    const int rank = static_cast<int>(shape_.size());
    if (level >= 0) {
      if (level >= rank) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), ": nested deeper than the shape ", ShapeString(shape_)));
      }
      const size_t count = CountElements(array);
      if (static_cast<int64_t>(count) != shape_[level]) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(), ": ", count, " entries; dimension ", level, " of shape ",
            ShapeString(shape_), " is ", shape_[level]));
      }
    }
    const bool leaf = level < 0 || level == rank - 1;
    path_.push_back(0);
    for (const dom::element e : array) {
      if (leaf) {
        if (absl::Status s = AppendNumber(e); !s.ok()) return s;
      } else {
        dom::array inner;
        if (e.get_array().get(inner) != simdjson::SUCCESS) {
          return WrongJsonType(Where(), "an array (nested data)", e);
        }
        if (absl::Status s = ReadLevel(inner, level + 1); !s.ok()) return s;
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
      case DType::kFloat64:
        return Append(value);
      case DType::kFloat32: {
        const float f = static_cast<float>(value);
        if (!std::isfinite(f)) return NotFinite(value);
        return Append(f);
      }
      default: {
        const uint16_t h = DoubleToHalf(dtype_, value);
        if (!std::isfinite(HalfToFloat(dtype_, h))) return NotFinite(value);
        return Append(h);
      }
    }
  }

  // Stores the next element into `out_` (sized up front: every value the
  // JSON can hold fits).
  template <typename T>
  absl::Status Append(T value) {
    if (written_ + sizeof(T) > out_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(Where(), ": more values than the body can hold"));
    }
    std::memcpy(out_.data() + written_, &value, sizeof(T));
    written_ += sizeof(T);
    return absl::OkStatus();
  }

  // The bytes written are the tensor's (the dims were checked on the way).
  absl::Status Finish(absl::Status status) {
    out_.resize(written_);
    return status;
  }

  absl::Status NotFinite(double value) const {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), ": ", value, " is not finite as ", OipDatatypeName(dtype_)));
  }

  const std::string field_;
  const DType dtype_;
  const Shape& shape_;
  const int64_t elements_;
  std::vector<char>& out_;
  size_t written_ = 0;
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
absl::Status ReadInput(const dom::element& e, size_t index, size_t json_bytes,
                       absl::string_view& binary, InferInput& input,
                       std::vector<char>& decoded) {
  const std::string field = absl::StrCat("inputs[", index, "]");
  std::optional<dom::element> data;
  std::optional<dom::element> binary_size;
  absl::Status status = ForEachMember(
      e, field, {"name", "shape", "datatype", "parameters", "data"},
      [&](absl::string_view key, dom::element value) -> absl::Status {
        const std::string where = absl::StrCat(field, ".", key);
        if (key == "name") return ReadString(value, where, input.name);
        if (key == "datatype") return ReadString(value, where, input.datatype);
        if (key == "shape") {
          dom::array dims;
          if (value.get_array().get(dims) != simdjson::SUCCESS) {
            return WrongJsonType(where, "an array of integers", value);
          }
          for (const dom::element dim : dims) {
            int64_t d = 0;
            if (dim.get_int64().get(d) != simdjson::SUCCESS) {
              return WrongJsonType(where, "an array of integers", dim);
            }
            input.shape.push_back(d);
          }
          return absl::OkStatus();
        }
        if (key == "parameters") {
          return ReadParameters(value, where, input.parameters,
                                "binary_data_size", binary_size);
        }
        data = value;
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
    input.data.contiguous = binary.substr(0, static_cast<size_t>(size));
    input.data_field = where;
    binary.remove_prefix(static_cast<size_t>(size));
    return absl::OkStatus();
  }
  input.data_field = absl::StrCat(field, ".data");
  input.data.contiguous = absl::string_view();
  const std::optional<DType> dtype = OipDatatype(input.datatype);
  if (!dtype.has_value()) return absl::OkStatus();  // The service names it.
  absl::StatusOr<int64_t> elements =
      NumElements(input.shape, absl::StrCat(field, ".shape"));
  if (!elements.ok()) return elements.status();
  if (absl::Status s =
          DataReader(input.data_field, *dtype, input.shape, *elements, decoded)
              .Read(*data, json_bytes);
      !s.ok()) {
    return s;
  }
  input.data.contiguous = absl::string_view(decoded.data(), decoded.size());
  return absl::OkStatus();
}

// One element of "outputs"; sets `binary` when it asks for binary data.
absl::Status ReadOutput(const dom::element& e, size_t index,
                        InferRequestedOutput& output,
                        std::optional<bool>& binary) {
  const std::string field = absl::StrCat("outputs[", index, "]");
  std::optional<dom::element> binary_data;
  absl::Status status = ForEachMember(
      e, field, {"name", "parameters"},
      [&](absl::string_view key, dom::element value) -> absl::Status {
        const std::string where = absl::StrCat(field, ".", key);
        if (key == "name") return ReadString(value, where, output.name);
        return ReadParameters(value, where, output.parameters, "binary_data",
                              binary_data);
      });
  if (!status.ok() || !binary_data.has_value()) return status;
  absl::StatusOr<bool> value =
      ReadBool(*binary_data, absl::StrCat(field, ".parameters.binary_data"));
  if (!value.ok()) return value.status();
  binary = *value;
  return absl::OkStatus();
}

// A simdjson parser for one body: this thread's, reused from body to body
// while they are small (its buffers are sized by the largest body it
// parsed), a fresh one for a large body, so that no thread keeps a large
// body's buffers.
class JsonParserLease {
 public:
  explicit JsonParserLease(size_t bytes) : reuse_(bytes <= kReusedBytes) {
    if (reuse_ && Slot() != nullptr) parser_ = std::move(Slot());
    if (parser_ == nullptr) parser_ = std::make_unique<dom::parser>();
  }
  ~JsonParserLease() {
    if (reuse_) Slot() = std::move(parser_);
  }
  JsonParserLease(const JsonParserLease&) = delete;
  JsonParserLease& operator=(const JsonParserLease&) = delete;

  // Parses `json`, `capacity` bytes of which are readable from its start.
  simdjson::error_code Parse(absl::string_view json, size_t capacity,
                             dom::element& root) {
    const bool padded = capacity >= json.size() + simdjson::SIMDJSON_PADDING;
    return parser_
        ->parse(json.data(), json.size(), /*realloc_if_needed=*/!padded)
        .get(root);
  }

 private:
  static constexpr size_t kReusedBytes = 1 << 20;
  static std::unique_ptr<dom::parser>& Slot() {
    thread_local std::unique_ptr<dom::parser> slot;
    return slot;
  }

  const bool reuse_;
  std::unique_ptr<dom::parser> parser_;
};

}  // namespace

size_t JsonPadding() { return simdjson::SIMDJSON_PADDING; }

absl::Status ParseInferBody(absl::string_view body, size_t body_capacity,
                            std::optional<absl::string_view> header_length,
                            absl::string_view model, absl::string_view version,
                            RestInferRequest& out) {
  absl::string_view json;
  absl::string_view binary;
  if (absl::Status s = SplitBody(body, header_length, json, binary); !s.ok()) {
    return s;
  }
  // The JSON part ends before the body when binary data follows; the body's
  // bytes after it are readable.
  JsonParserLease parser(json.size());
  dom::element root;
  if (const simdjson::error_code error =
          parser.Parse(json, body_capacity, root);
      error != simdjson::SUCCESS) {
    return absl::InvalidArgumentError(absl::StrCat(
        "body: malformed JSON (", simdjson::error_message(error), ")"));
  }
  {
    InferRequest& request = out.request;
    request.model_name = std::string(model);
    request.model_version = std::string(version);
    std::optional<dom::element> binary_output_all;
    std::optional<bool> binary_output;
    bool has_inputs = false;
    absl::Status members = ForEachMember(
        root, "", {"id", "parameters", "inputs", "outputs"},
        [&](absl::string_view key, dom::element value) -> absl::Status {
          if (key == "id") return ReadString(value, "id", request.id);
          if (key == "parameters") {
            return ReadParameters(value, "parameters", request.parameters,
                                  "binary_data_output", binary_output_all);
          }
          dom::array array;
          if (value.get_array().get(array) != simdjson::SUCCESS) {
            return WrongJsonType(key, "an array of objects", value);
          }
          const size_t count = CountElements(array);
          if (key == "inputs") {
            has_inputs = true;
            request.inputs.resize(count);
            out.decoded.resize(count);
          } else {
            request.outputs.resize(count);
          }
          size_t index = 0;
          for (const dom::element e : array) {
            absl::Status s =
                key == "inputs"
                    ? ReadInput(e, index, json.size(), binary,
                                request.inputs[index], out.decoded[index])
                    : ReadOutput(e, index, request.outputs[index],
                                 binary_output);
            if (!s.ok()) return s;
            ++index;
          }
          return absl::OkStatus();
        });
    if (!members.ok()) return members;
    if (!has_inputs) return absl::InvalidArgumentError("inputs: required");
    if (!binary.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("body: ", binary.size(),
                       " bytes of binary data after the JSON that no input's "
                       "parameters.binary_data_size claims"));
    }
    out.binary_output = false;
    if (binary_output_all.has_value()) {
      absl::StatusOr<bool> all =
          ReadBool(*binary_output_all, "parameters.binary_data_output");
      if (!all.ok()) return all.status();
      out.binary_output = *all;
    }
    if (binary_output.has_value()) out.binary_output = *binary_output;
    return absl::OkStatus();
  }
}

}  // namespace normd

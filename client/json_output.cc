#include "client/json_output.h"

#include <google/protobuf/descriptor.h>

#include <charconv>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/tensor_io.h"
#include "normd/v1/normalizer.pb.h"

namespace normd::client {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// The shortest text that reads back as `value` (as a float when
// `as_float`, which every 32- and 16-bit element is exactly).
void AppendNumber(double value, bool as_float, std::string& out) {
  if (std::isnan(value)) {
    out += "\"NaN\"";
    return;
  }
  if (std::isinf(value)) {
    out += value > 0 ? "\"Infinity\"" : "\"-Infinity\"";
    return;
  }
  char buffer[32];
  const std::to_chars_result written =
      as_float ? std::to_chars(buffer, buffer + sizeof(buffer),
                               static_cast<float>(value))
               : std::to_chars(buffer, buffer + sizeof(buffer), value);
  out.append(buffer, written.ptr);
}

void AppendIndent(int depth, std::string& out) {
  out += '\n';
  out.append(2 * depth, ' ');
}

void AppendMessage(const Message& message, bool all_fields, int depth,
                   std::string& out);

// One element of `field` (index -1: the singular value).
void AppendValue(const Message& message, const FieldDescriptor* field,
                 int index, bool all_fields, int depth, std::string& out) {
  const Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      absl::StrAppend(&out, repeated
                                ? r->GetRepeatedInt32(message, field, index)
                                : r->GetInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_INT64:
      absl::StrAppend(&out, repeated
                                ? r->GetRepeatedInt64(message, field, index)
                                : r->GetInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT32:
      absl::StrAppend(&out, repeated
                                ? r->GetRepeatedUInt32(message, field, index)
                                : r->GetUInt32(message, field));
      break;
    case FieldDescriptor::CPPTYPE_UINT64:
      absl::StrAppend(&out, repeated
                                ? r->GetRepeatedUInt64(message, field, index)
                                : r->GetUInt64(message, field));
      break;
    case FieldDescriptor::CPPTYPE_DOUBLE:
      AppendNumber(repeated ? r->GetRepeatedDouble(message, field, index)
                            : r->GetDouble(message, field),
                   false, out);
      break;
    case FieldDescriptor::CPPTYPE_FLOAT:
      AppendNumber(repeated ? r->GetRepeatedFloat(message, field, index)
                            : r->GetFloat(message, field),
                   true, out);
      break;
    case FieldDescriptor::CPPTYPE_BOOL:
      out += (repeated ? r->GetRepeatedBool(message, field, index)
                       : r->GetBool(message, field))
                 ? "true"
                 : "false";
      break;
    case FieldDescriptor::CPPTYPE_ENUM:
      out += JsonString((repeated ? r->GetRepeatedEnum(message, field, index)
                                  : r->GetEnum(message, field))
                            ->name());
      break;
    case FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& text =
          repeated
              ? r->GetRepeatedStringReference(message, field, index, &scratch)
              : r->GetStringReference(message, field, &scratch);
      // Only a tensor's data is bytes in normd's replies: numbers then.
      out += field->type() == FieldDescriptor::TYPE_BYTES
                 ? absl::StrCat("\"<", text.size(), " bytes>\"")
                 : JsonString(text);
      break;
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      AppendMessage(repeated ? r->GetRepeatedMessage(message, field, index)
                             : r->GetMessage(message, field),
                    all_fields, depth, out);
      break;
  }
}

// A tensor's elements as numbers: `data` decoded by dtype, or `values`.
void AppendTensorData(const v1::Tensor& tensor, std::string& out) {
  absl::StatusOr<std::vector<double>> values = TensorValues(tensor);
  if (!values.ok()) {
    out += JsonString(absl::StrCat("<", values.status().message(), ">"));
    return;
  }
  const bool as_float =
      tensor.values_size() == 0 && tensor.dtype() != v1::FLOAT64;
  out += '[';
  for (size_t i = 0; i < values->size(); ++i) {
    if (i > 0) out += ", ";
    AppendNumber((*values)[i], as_float, out);
  }
  out += ']';
}

void AppendMessage(const Message& message, bool all_fields, int depth,
                   std::string& out) {
  const Reflection* r = message.GetReflection();
  const auto* tensor = dynamic_cast<const v1::Tensor*>(&message);
  std::vector<const FieldDescriptor*> fields;
  if (all_fields) {
    const google::protobuf::Descriptor* d = message.GetDescriptor();
    for (int i = 0; i < d->field_count(); ++i) {
      const FieldDescriptor* f = d->field(i);
      // Unset sub-messages and oneof members stay out, as in proto3 JSON.
      if ((f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE ||
           f->containing_oneof() != nullptr) &&
          !f->is_repeated() && !r->HasField(message, f)) {
        continue;
      }
      fields.push_back(f);
    }
  } else {
    r->ListFields(message, &fields);
  }
  if (fields.empty()) {
    out += "{}";
    return;
  }
  out += '{';
  for (size_t i = 0; i < fields.size(); ++i) {
    const FieldDescriptor* field = fields[i];
    if (i > 0) out += ',';
    AppendIndent(depth + 1, out);
    absl::StrAppend(&out, JsonString(field->name()), ": ");
    if (tensor != nullptr &&
        (field->number() == v1::Tensor::kDataFieldNumber ||
         field->number() == v1::Tensor::kValuesFieldNumber)) {
      AppendTensorData(*tensor, out);
    } else if (field->is_repeated()) {
      const int size = r->FieldSize(message, field);
      out += '[';
      const bool nested = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
      for (int j = 0; j < size; ++j) {
        if (j > 0) out += nested ? "," : ", ";
        if (nested) AppendIndent(depth + 2, out);
        AppendValue(message, field, j, all_fields, depth + 2, out);
      }
      if (nested && size > 0) AppendIndent(depth + 1, out);
      out += ']';
    } else {
      AppendValue(message, field, -1, all_fields, depth + 1, out);
    }
  }
  AppendIndent(depth, out);
  out += '}';
}

}  // namespace

std::string MessageToJson(const google::protobuf::Message& message,
                          bool all_fields) {
  std::string out;
  AppendMessage(message, all_fields, 0, out);
  out += '\n';
  return out;
}

std::string JsonString(absl::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace normd::client

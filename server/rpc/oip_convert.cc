#include "server/rpc/oip_convert.h"

#include <bit>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/rpc/convert.h"
#include "server/service/oip_models.h"

namespace normd {
namespace {

// Raw contents and typed fp32/fp64 contents share the native bytes' layout.
static_assert(std::endian::native == std::endian::little,
              "OIP raw contents are little-endian, as normd.v1 tensor data");

using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

InferValue ValueOf(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return p.bool_param();
    case InferParameter::kInt64Param:
      return p.int64_param();
    case InferParameter::kDoubleParam:
      return p.double_param();
    case InferParameter::kStringParam:
      return p.string_param();
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return std::monostate();
}

InferParameters ParametersOf(
    const google::protobuf::Map<std::string, InferParameter>& parameters) {
  InferParameters out;
  out.reserve(parameters.size());
  for (const auto& [name, value] : parameters) {
    out.push_back({name, ValueOf(value)});
  }
  return out;
}

// How many typed values `c` holds, in all its fields together.
int TypedCount(const inference::InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() +
         c.int64_contents_size() + c.uint_contents_size() +
         c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

// memcpy that takes empty ranges (an empty repeated field's data() is null).
void CopyBytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

// Typed contents as the tensor's raw bytes; the datatype is known.
absl::Status TypedToBytes(const ModelInferRequest::InferInputTensor& input,
                          absl::string_view field, DType dtype,
                          std::string& data) {
  const inference::InferTensorContents& c = input.contents();
  const int total = TypedCount(c);
  if (dtype == DType::kFloat32 && total == c.fp32_contents_size()) {
    data.resize(sizeof(float) * c.fp32_contents_size());
    CopyBytes(data.data(), c.fp32_contents().data(), data.size());
    return absl::OkStatus();
  }
  if (dtype == DType::kFloat64 && total == c.fp64_contents_size()) {
    data.resize(sizeof(double) * c.fp64_contents_size());
    CopyBytes(data.data(), c.fp64_contents().data(), data.size());
    return absl::OkStatus();
  }
  if (dtype == DType::kFloat16 || dtype == DType::kBFloat16) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".contents: ", input.datatype(),
                     " elements are taken only as raw_input_contents"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".contents: ", input.datatype(), " elements go in ",
                   dtype == DType::kFloat32 ? "fp32_contents" : "fp64_contents",
                   ", and no other contents field"));
}

void SetCounters(const InferReply& reply, ModelInferResponse& response) {
  if (!reply.counters.has_value()) return;
  auto& parameters = *response.mutable_parameters();
  parameters["num_batches_tracked"].set_int64_param(
      reply.counters->num_batches_tracked);
  // Unsigned: an int64 up to INT64_MAX, decimal text past it.
  const uint64_t generation = reply.counters->generation;
  if (generation <=
      static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    parameters["generation"].set_int64_param(static_cast<int64_t>(generation));
  } else {
    parameters["generation"].set_string_param(absl::StrCat(generation));
  }
}

// Everything of the response but the output's elements.
ModelInferResponse::InferOutputTensor* SetHead(const ModelInferRequest& message,
                                               const InferReply& reply,
                                               ModelInferResponse& response) {
  response.set_model_name(message.model_name());
  response.set_model_version(kOipModelVersion);
  response.set_id(message.id());
  SetCounters(reply, response);
  if (!reply.output.has_output) return nullptr;
  ModelInferResponse::InferOutputTensor& output = *response.add_outputs();
  output.set_name("output");
  output.set_datatype(reply.output.datatype);
  output.mutable_shape()->Assign(reply.output.shape.begin(),
                                 reply.output.shape.end());
  return &output;
}

}  // namespace

std::vector<TensorBytes> RawContentsOf(const ModelInferRequest& message) {
  std::vector<TensorBytes> raw;
  raw.reserve(message.raw_input_contents_size());
  for (const std::string& bytes : message.raw_input_contents()) {
    raw.push_back(TensorBytes{.contiguous = bytes, .scattered = nullptr});
  }
  return raw;
}

absl::Status ToInferRequest(const ModelInferRequest& message,
                            absl::Span<const TensorBytes> raw,
                            std::vector<std::string>& typed,
                            InferRequest& request) {
  const int inputs = message.inputs_size();
  if (!raw.empty() && static_cast<int>(raw.size()) != inputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: ", raw.size(), " entries for ",
                     inputs, " inputs; give one per input, in input order"));
  }
  request.model_name = message.model_name();
  request.model_version = message.model_version();
  request.id = message.id();
  request.parameters = ParametersOf(message.parameters());
  request.inputs.resize(inputs);
  typed.resize(raw.empty() ? inputs : 0);
  for (int i = 0; i < inputs; ++i) {
    const ModelInferRequest::InferInputTensor& from = message.inputs(i);
    InferInput& input = request.inputs[i];
    const std::string field = absl::StrCat("inputs[", i, "]");
    input.name = from.name();
    input.datatype = from.datatype();
    input.shape.assign(from.shape().begin(), from.shape().end());
    input.parameters = ParametersOf(from.parameters());
    if (!raw.empty()) {
      if (TypedCount(from.contents()) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field,
            ".contents: typed contents in a request with raw_input_contents; "
            "use one form for every input"));
      }
      input.data = raw[i];
      input.data_field.clear();  // Its capacity is reused.
      absl::StrAppend(&input.data_field, "raw_input_contents[", i, "]");
      continue;
    }
    typed[i].clear();  // A reused request's earlier contents.
    // An unknown datatype is the service's to name.
    if (const std::optional<DType> dtype = OipDatatype(from.datatype())) {
      if (absl::Status s = TypedToBytes(from, field, *dtype, typed[i]);
          !s.ok()) {
        return s;
      }
    }
    input.data = TensorBytes{.contiguous = typed[i], .scattered = nullptr};
    input.data_field.clear();
    absl::StrAppend(&input.data_field, field, ".contents");
  }
  request.outputs.resize(message.outputs_size());
  for (int k = 0; k < message.outputs_size(); ++k) {
    request.outputs[k].name = message.outputs(k).name();
    request.outputs[k].parameters =
        ParametersOf(message.outputs(k).parameters());
  }
  return absl::OkStatus();
}

void OipRawResponseHead(const ModelInferRequest& message,
                        const InferReply& reply, std::string& head) {
  // This thread's head message, reused: protobuf keeps a cleared message's
  // strings and repeated fields, so a warm thread builds the head without
  // allocating. It never holds tensor data.
  thread_local ModelInferResponse response;
  response.Clear();
  SetHead(message, reply, response);
  const size_t size = response.ByteSizeLong();
  constexpr size_t kMaxKeyBytes = 1 + 10;  // The tag and a 64-bit varint.
  head.clear();
  head.reserve(size + kMaxKeyBytes);
  head.resize(size);
  response.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(head.data()));
  if (reply.output.has_output) {
    constexpr uint32_t kRawOutputContentsField = 6;
    AppendLengthDelimitedKey(kRawOutputContentsField, reply.output.bytes, head);
  }
}

void ToModelInferResponse(const ModelInferRequest& message,
                          const InferReply& reply, absl::string_view output,
                          bool raw, ModelInferResponse& response) {
  ModelInferResponse::InferOutputTensor* tensor =
      SetHead(message, reply, response);
  if (tensor == nullptr) return;
  if (raw) {
    response.add_raw_output_contents()->assign(output.data(), output.size());
  } else if (reply.output.dtype == DType::kFloat64) {
    auto& values = *tensor->mutable_contents()->mutable_fp64_contents();
    values.Resize(static_cast<int>(output.size() / sizeof(double)), 0.0);
    CopyBytes(values.mutable_data(), output.data(), output.size());
  } else {
    auto& values = *tensor->mutable_contents()->mutable_fp32_contents();
    values.Resize(static_cast<int>(output.size() / sizeof(float)), 0.0f);
    CopyBytes(values.mutable_data(), output.data(), output.size());
  }
}

void ToModelMetadataResponse(const OipModelMetadata& metadata,
                             inference::ModelMetadataResponse& response) {
  response.set_name(metadata.name);
  for (const std::string& version : metadata.versions) {
    response.add_versions(version);
  }
  response.set_platform(metadata.platform);
  for (const auto& [from, to] :
       {std::pair{&metadata.inputs, response.mutable_inputs()},
        std::pair{&metadata.outputs, response.mutable_outputs()}}) {
    for (const OipTensorMetadata& t : *from) {
      auto* tensor = to->Add();
      tensor->set_name(t.name);
      tensor->set_datatype(t.datatype);
      tensor->mutable_shape()->Assign(t.shape.begin(), t.shape.end());
    }
  }
}

}  // namespace normd

#include "server/rpc/oip_convert.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/rpc/convert.h"
#include "server/rpc/status_mapping.h"

namespace normd {
namespace {

// Raw contents and typed fp32/fp64 contents share the native bytes' layout.
static_assert(std::endian::native == std::endian::little,
              "OIP raw contents are little-endian, as normd.v1 tensor data");

using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

struct BuiltinModel {
  const char* name;
  v1::Mode mode;
};
constexpr BuiltinModel kBuiltinModels[] = {
    {"layer_norm", v1::LAYER_NORM}, {"rms_norm", v1::RMS_NORM},
    {"group_norm", v1::GROUP_NORM}, {"instance_norm", v1::INSTANCE_NORM},
    {"l2_norm", v1::L2_NORM},       {"weight_norm", v1::WEIGHT_NORM},
};

struct Datatype {
  const char* name;
  v1::DataType dtype;
};
constexpr Datatype kDatatypes[] = {
    {"FP32", v1::FLOAT32},
    {"FP64", v1::FLOAT64},
    {"FP16", v1::FLOAT16},
    {"BF16", v1::BFLOAT16},
};

// The request parameters, as bits of the set a model takes.
enum Param : unsigned {
  kNormalizedNdim = 1 << 0,
  kEps = 1 << 1,
  kNumGroups = 1 << 2,
  kChannelAxis = 1 << 3,
  kStyle = 1 << 4,
  kTraining = 1 << 5,
  kFit = 1 << 6,
};
struct ParamName {
  const char* name;
  Param param;
};
constexpr ParamName kParams[] = {
    {"normalized_ndim", kNormalizedNdim},
    {"eps", kEps},
    {"num_groups", kNumGroups},
    {"channel_axis", kChannelAxis},
    {"style", kStyle},
    {"training", kTraining},
    {"fit", kFit},
};

// The parameters a model takes (nullopt: a BatchNorm model of the store).
unsigned ParamsOf(std::optional<v1::Mode> mode) {
  if (!mode.has_value()) return kEps | kChannelAxis | kTraining | kFit;
  switch (*mode) {
    case v1::LAYER_NORM:
      return kNormalizedNdim | kEps | kStyle;
    case v1::RMS_NORM:
    case v1::L2_NORM:
      return kNormalizedNdim | kEps;
    case v1::GROUP_NORM:
      return kNumGroups | kEps | kChannelAxis;
    case v1::WEIGHT_NORM:
      return kChannelAxis;
    default:
      return kEps | kChannelAxis;
  }
}

std::string ParamNames(unsigned params) {
  std::vector<const char*> names;
  for (const ParamName& p : kParams) {
    if ((params & p.param) != 0) names.push_back(p.name);
  }
  return absl::StrJoin(names, ", ");
}

const char* KindOf(const InferParameter& p) {
  switch (p.parameter_choice_case()) {
    case InferParameter::kBoolParam:
      return "a bool";
    case InferParameter::kInt64Param:
      return "an int64";
    case InferParameter::kStringParam:
      return "a string";
    case InferParameter::kDoubleParam:
      return "a double";
    case InferParameter::PARAMETER_CHOICE_NOT_SET:
      break;
  }
  return "no value";
}

absl::Status WrongType(absl::string_view name, absl::string_view want,
                       const InferParameter& p) {
  return absl::InvalidArgumentError(absl::StrCat(
      "parameters.", name, ": must be ", want, ", got ", KindOf(p)));
}

absl::StatusOr<int32_t> Int32Param(absl::string_view name,
                                   const InferParameter& p) {
  if (p.parameter_choice_case() != InferParameter::kInt64Param) {
    return WrongType(name, "an int64", p);
  }
  if (p.int64_param() < std::numeric_limits<int32_t>::min() ||
      p.int64_param() > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters.", name, ": ", p.int64_param(), " is out of range"));
  }
  return static_cast<int32_t>(p.int64_param());
}

absl::StatusOr<double> DoubleParam(absl::string_view name,
                                   const InferParameter& p) {
  if (p.parameter_choice_case() == InferParameter::kDoubleParam) {
    return p.double_param();
  }
  if (p.parameter_choice_case() != InferParameter::kStringParam) {
    return WrongType(name, "a double (or a string holding a number)", p);
  }
  double value = 0;
  if (!absl::SimpleAtod(p.string_param(), &value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters.", name, ": ",
                     QuotedForMessage(p.string_param()), " is not a number"));
  }
  return value;
}

absl::StatusOr<bool> BoolParam(absl::string_view name,
                               const InferParameter& p) {
  if (p.parameter_choice_case() != InferParameter::kBoolParam) {
    return WrongType(name, "a bool", p);
  }
  return p.bool_param();
}

absl::StatusOr<v1::LayerNormStyle> StyleParam(const InferParameter& p) {
  if (p.parameter_choice_case() != InferParameter::kStringParam) {
    return WrongType("style", "a string", p);
  }
  if (p.string_param() == "pytorch") return v1::PYTORCH;
  if (p.string_param() == "bert") return v1::BERT_UNBIASED_STD;
  return absl::InvalidArgumentError(
      absl::StrCat("parameters.style: ", QuotedForMessage(p.string_param()),
                   " is not a style; use pytorch or bert"));
}

// The request parameters into `call` for a model that takes `allowed`, in
// name order (so that the first of several problems is always the same).
absl::Status TranslateParameters(
    const google::protobuf::Map<std::string, InferParameter>& parameters,
    absl::string_view model, unsigned allowed, NativeInferCall& call) {
  std::vector<const std::string*> names;
  for (const auto& [name, value] : parameters) names.push_back(&name);
  std::sort(names.begin(), names.end(),
            [](const std::string* a, const std::string* b) { return *a < *b; });
  v1::NormalizeRequest& normalize = call.normalize;
  bool has_eps = false;
  bool training = false;
  for (const std::string* name : names) {
    const InferParameter& p = parameters.at(*name);
    const ParamName* known = nullptr;
    for (const ParamName& candidate : kParams) {
      if (*name == candidate.name) known = &candidate;
    }
    if (known == nullptr || (allowed & known->param) == 0) {
      return absl::InvalidArgumentError(
          known == nullptr
              ? absl::StrCat("parameters: unknown parameter ",
                             QuotedForMessage(*name), "; model ",
                             QuotedForMessage(model), " takes ",
                             ParamNames(allowed))
              : absl::StrCat("parameters.", *name, ": does not apply to model ",
                             QuotedForMessage(model), ", which takes ",
                             ParamNames(allowed)));
    }
    absl::Status status;
    switch (known->param) {
      case kNormalizedNdim: {
        absl::StatusOr<int32_t> v = Int32Param(*name, p);
        if (v.ok()) normalize.set_normalized_ndim(*v);
        status = v.status();
        break;
      }
      case kEps: {
        absl::StatusOr<double> v = DoubleParam(*name, p);
        if (v.ok()) normalize.set_eps(*v);
        has_eps = true;
        status = v.status();
        break;
      }
      case kNumGroups:
        if (p.parameter_choice_case() != InferParameter::kInt64Param) {
          return WrongType(*name, "an int64", p);
        }
        normalize.set_num_groups(p.int64_param());
        break;
      case kChannelAxis: {
        absl::StatusOr<int32_t> v = Int32Param(*name, p);
        if (v.ok()) {
          normalize.set_channel_axis(*v);
          call.fit_request.set_channel_axis(*v);
        }
        status = v.status();
        break;
      }
      case kStyle: {
        absl::StatusOr<v1::LayerNormStyle> v = StyleParam(p);
        if (v.ok()) normalize.set_layer_norm_style(*v);
        status = v.status();
        break;
      }
      case kTraining: {
        absl::StatusOr<bool> v = BoolParam(*name, p);
        if (v.ok()) normalize.set_training(training = *v);
        status = v.status();
        break;
      }
      case kFit: {
        absl::StatusOr<bool> v = BoolParam(*name, p);
        if (v.ok()) call.fit = *v;
        status = v.status();
        break;
      }
    }
    if (!status.ok()) return status;
  }
  if (call.fit && (training || has_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters.", training ? "training" : "eps",
        ": does not apply with fit (which updates the model's statistics "
        "and normalizes nothing)"));
  }
  return absl::OkStatus();
}

// memcpy that takes empty ranges (an empty repeated field's data() is null).
void CopyBytes(void* to, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(to, from, bytes);
}

// How many typed values `c` holds, in all its fields together.
int TypedCount(const inference::InferTensorContents& c) {
  return c.bool_contents_size() + c.int_contents_size() +
         c.int64_contents_size() + c.uint_contents_size() +
         c.uint64_contents_size() + c.fp32_contents_size() +
         c.fp64_contents_size() + c.bytes_contents_size();
}

// Typed contents as the native tensor's bytes.
absl::Status TypedToBytes(const ModelInferRequest::InferInputTensor& input,
                          const std::string& field, v1::DataType dtype,
                          std::string& data) {
  const inference::InferTensorContents& c = input.contents();
  const int total = TypedCount(c);
  if (dtype == v1::FLOAT32 && total == c.fp32_contents_size()) {
    data.resize(sizeof(float) * c.fp32_contents_size());
    CopyBytes(data.data(), c.fp32_contents().data(), data.size());
    return absl::OkStatus();
  }
  if (dtype == v1::FLOAT64 && total == c.fp64_contents_size()) {
    data.resize(sizeof(double) * c.fp64_contents_size());
    CopyBytes(data.data(), c.fp64_contents().data(), data.size());
    return absl::OkStatus();
  }
  if (dtype == v1::FLOAT16 || dtype == v1::BFLOAT16) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".contents: ", input.datatype(),
                     " elements are taken only as raw_input_contents"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ".contents: ", input.datatype(), " elements go in ",
                   dtype == v1::FLOAT32 ? "fp32_contents" : "fp64_contents",
                   ", and no other contents field"));
}

// Each input's native tensor, named input, weight or bias.
absl::Status TranslateInputs(ModelInferRequest& request,
                             NativeInferCall& call) {
  const int inputs = request.inputs_size();
  call.raw = request.raw_input_contents_size() > 0;
  if (call.raw && request.raw_input_contents_size() != inputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("raw_input_contents: ", request.raw_input_contents_size(),
                     " entries for ", inputs,
                     " inputs; give one per input, in input order"));
  }
  bool seen[3] = {false, false, false};
  for (int i = 0; i < inputs; ++i) {
    ModelInferRequest::InferInputTensor& input = *request.mutable_inputs(i);
    const std::string field = absl::StrCat("inputs[", i, "]");
    constexpr const char* kRoles[] = {"input", "weight", "bias"};
    int role = 0;
    while (role < 3 && input.name() != kRoles[role]) ++role;
    if (role == 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name: unknown input ", QuotedForMessage(input.name()),
          "; the model takes input, weight and bias"));
    }
    if (seen[role]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: a second input named ", kRoles[role]));
    }
    seen[role] = true;
    const Datatype* datatype = nullptr;
    for (const Datatype& d : kDatatypes) {
      if (input.datatype() == d.name) datatype = &d;
    }
    if (datatype == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".datatype: ", QuotedForMessage(input.datatype()),
                       " is not supported; use FP32, FP64, FP16 or BF16"));
    }
    if (!input.parameters().empty()) {
      std::string first = input.parameters().begin()->first;
      for (const auto& [name, value] : input.parameters()) {
        first = std::min(first, name);
      }
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parameters: unknown tensor parameter ",
                       QuotedForMessage(first)));
    }
    if (role != 0 && call.fit) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: ", kRoles[role],
                       " does not apply with fit, which normalizes nothing"));
    }
    v1::Tensor* tensor = role == 0   ? call.normalize.mutable_input()
                         : role == 1 ? call.normalize.mutable_weight()
                                     : call.normalize.mutable_bias();
    tensor->set_dtype(datatype->dtype);
    tensor->mutable_shape()->CopyFrom(input.shape());
    if (call.raw) {
      if (TypedCount(input.contents()) > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            field,
            ".contents: typed contents in a request with raw_input_contents; "
            "use one form for every input"));
      }
      tensor->mutable_data()->swap(*request.mutable_raw_input_contents(i));
    } else if (absl::Status s = TypedToBytes(input, field, datatype->dtype,
                                             *tensor->mutable_data());
               !s.ok()) {
      return s;
    }
    if (role == 0) call.datatype = datatype->name;
  }
  if (!seen[0]) {
    return absl::InvalidArgumentError(
        "inputs: no input named \"input\" (the tensor to normalize)");
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<v1::Mode> BuiltinOipModel(absl::string_view name) {
  for (const BuiltinModel& model : kBuiltinModels) {
    if (name == model.name) return model.mode;
  }
  return std::nullopt;
}

std::optional<v1::DataType> OipDatatype(absl::string_view name) {
  for (const Datatype& d : kDatatypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

absl::Status CheckOipVersion(absl::string_view version, absl::string_view model,
                             absl::string_view field) {
  if (version.empty() || version == kOipModelVersion) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      field, ": model ", QuotedForMessage(model), " has no version ",
      QuotedForMessage(version), "; its one version is \"1\""));
}

void NativeInferCall::Clear() {
  fit = false;
  normalize.Clear();
  fit_request.Clear();
  raw = false;
  datatype.clear();
  batch_norm = false;
}

absl::Status ToNativeInfer(ModelInferRequest& request, NativeInferCall& call) {
  if (request.model_name().empty()) {
    return absl::InvalidArgumentError("model_name: required");
  }
  const std::optional<v1::Mode> builtin = BuiltinOipModel(request.model_name());
  call.batch_norm = !builtin.has_value();
  if (absl::Status s = TranslateParameters(
          request.parameters(), request.model_name(), ParamsOf(builtin), call);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = TranslateInputs(request, call); !s.ok()) return s;
  for (int k = 0; k < request.outputs_size(); ++k) {
    const ModelInferRequest::InferRequestedOutputTensor& output =
        request.outputs(k);
    if (output.name() != "output") {
      return absl::InvalidArgumentError(absl::StrCat(
          "outputs[", k, "].name: unknown output ",
          QuotedForMessage(output.name()), "; the model has output"));
    }
    if (!output.parameters().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("outputs[", k, "].parameters: unknown output parameter ",
                       QuotedForMessage(output.parameters().begin()->first)));
    }
  }
  if (absl::Status s = CheckOipVersion(request.model_version(),
                                       request.model_name(), "model_version");
      !s.ok()) {
    return s;
  }
  v1::NormalizeRequest& normalize = call.normalize;
  normalize.set_request_id(request.id());
  normalize.set_mode(builtin.value_or(v1::BATCH_NORM));
  if (call.batch_norm) normalize.set_model(request.model_name());
  if (call.fit) {
    call.fit_request.set_model(request.model_name());
    call.fit_request.set_request_id(request.id());
    call.fit_request.mutable_input()->Swap(normalize.mutable_input());
  }
  return absl::OkStatus();
}

namespace {

void SetCounters(const v1::ModelState& model, ModelInferResponse& response) {
  auto& parameters = *response.mutable_parameters();
  parameters["num_batches_tracked"].set_int64_param(
      model.num_batches_tracked());
  parameters["generation"].set_int64_param(
      static_cast<int64_t>(model.generation()));
}

void SetHead(const ModelInferRequest& request, ModelInferResponse& response) {
  response.set_model_name(request.model_name());
  response.set_model_version(kOipModelVersion);
  response.set_id(request.id());
}

// Everything of the response to a Normalize but the output's elements.
ModelInferResponse::InferOutputTensor& SetNormalizeHead(
    const ModelInferRequest& request, const NativeInferCall& call,
    const v1::Tensor& output_meta, const v1::NormalizeResponse& reply,
    ModelInferResponse& response) {
  SetHead(request, response);
  ModelInferResponse::InferOutputTensor& output = *response.add_outputs();
  output.set_name("output");
  output.set_datatype(call.datatype);
  *output.mutable_shape() = output_meta.shape();
  if (call.batch_norm && reply.has_model()) {
    SetCounters(reply.model(), response);
  }
  return output;
}

}  // namespace

std::string OipRawResponseHead(const ModelInferRequest& request,
                               const NativeInferCall& call,
                               const v1::Tensor& output_meta,
                               int64_t payload_bytes,
                               const v1::NormalizeResponse& reply) {
  // This thread's head message, reused: protobuf keeps a cleared message's
  // strings and repeated fields, so a warm thread builds the head without
  // allocating. It never holds tensor data.
  thread_local ModelInferResponse response;
  response.Clear();
  SetNormalizeHead(request, call, output_meta, reply, response);
  const size_t size = response.ByteSizeLong();
  constexpr size_t kMaxKeyBytes = 1 + 10;  // The tag and a 64-bit varint.
  std::string head;
  head.reserve(size + kMaxKeyBytes);
  head.resize(size);
  response.SerializeWithCachedSizesToArray(
      reinterpret_cast<uint8_t*>(head.data()));
  constexpr uint32_t kRawOutputContentsField = 6;
  AppendLengthDelimitedKey(kRawOutputContentsField, payload_bytes, head);
  return head;
}

void FromNativeNormalize(const ModelInferRequest& request,
                         const NativeInferCall& call,
                         v1::NormalizeResponse& reply,
                         ModelInferResponse& response) {
  ModelInferResponse::InferOutputTensor& output =
      SetNormalizeHead(request, call, reply.output(), reply, response);
  std::string& data = *reply.mutable_output()->mutable_data();
  if (call.raw) {
    response.add_raw_output_contents()->swap(data);
  } else if (reply.output().dtype() == v1::FLOAT64) {
    auto& values = *output.mutable_contents()->mutable_fp64_contents();
    values.Resize(static_cast<int>(data.size() / sizeof(double)), 0.0);
    CopyBytes(values.mutable_data(), data.data(), data.size());
  } else {
    auto& values = *output.mutable_contents()->mutable_fp32_contents();
    values.Resize(static_cast<int>(data.size() / sizeof(float)), 0.0f);
    CopyBytes(values.mutable_data(), data.data(), data.size());
  }
}

void FromNativeFit(const ModelInferRequest& request,
                   const v1::FitResponse& reply, ModelInferResponse& response) {
  SetHead(request, response);
  SetCounters(reply.model(), response);
}

void OipModelMetadata(absl::string_view name,
                      std::optional<int64_t> num_features,
                      inference::ModelMetadataResponse& response) {
  response.set_name(std::string(name));
  response.add_versions(kOipModelVersion);
  response.set_platform("normd");
  auto add = [](auto* tensors, const char* tensor_name,
                std::vector<int64_t> shape) {
    auto* tensor = tensors->Add();
    tensor->set_name(tensor_name);
    tensor->set_datatype("FP32");
    for (int64_t dim : shape) tensor->add_shape(dim);
  };
  // Built-in models take any rank; a BatchNorm model [N, C, ...] with C its
  // channels, its parameters [C].
  const std::vector<int64_t> data =
      num_features.has_value() ? std::vector<int64_t>{-1, *num_features}
                               : std::vector<int64_t>{-1};
  const std::vector<int64_t> params = num_features.has_value()
                                          ? std::vector<int64_t>{*num_features}
                                          : std::vector<int64_t>{-1};
  // The affine inputs the model takes: L2_NORM none, WEIGHT_NORM only its
  // g (`weight`).
  const v1::Mode mode = num_features.has_value()
                            ? v1::BATCH_NORM
                            : BuiltinOipModel(name).value_or(v1::BATCH_NORM);
  add(response.mutable_inputs(), "input", data);
  if (mode != v1::L2_NORM) add(response.mutable_inputs(), "weight", params);
  if (mode != v1::L2_NORM && mode != v1::WEIGHT_NORM) {
    add(response.mutable_inputs(), "bias", params);
  }
  add(response.mutable_outputs(), "output", data);
}

}  // namespace normd

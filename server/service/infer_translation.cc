#include "server/service/infer_translation.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/service/oip_models.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

// The request parameters normd takes, as bits of the set a model takes.
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

// What KServe and Triton clients send that means nothing to normd: accepted
// and ignored, whatever their value (binary_data_output, binary_data_size
// and binary_data are the REST front end's, which reads them itself).
constexpr const char* kToleratedRequestParams[] = {
    "timeout",        "priority",     "sequence_id",
    "sequence_start", "sequence_end", "binary_data_output"};
constexpr const char* kToleratedInputParams[] = {"content_type",
                                                 "binary_data_size"};
constexpr const char* kToleratedOutputParams[] = {"binary_data"};

template <size_t N>
bool IsOneOf(absl::string_view name, const char* const (&names)[N]) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// The parameters a model takes (nullopt: a BatchNorm model of the store).
unsigned ParamsOf(std::optional<NormMode> mode) {
  if (!mode.has_value()) return kEps | kChannelAxis | kTraining | kFit;
  switch (*mode) {
    case NormMode::kLayerNorm:
      return kNormalizedNdim | kEps | kStyle;
    case NormMode::kRmsNorm:
    case NormMode::kL2Norm:
      return kNormalizedNdim | kEps;
    case NormMode::kGroupNorm:
      return kNumGroups | kEps | kChannelAxis;
    case NormMode::kWeightNorm:
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

const char* KindOf(const InferValue& value) {
  switch (value.index()) {
    case 0:
      return "no value";
    case 1:
      return "a bool";
    case 2:
      return "an int64";
    case 3:
      return "a double";
    default:
      return "a string";
  }
}

absl::Status WrongType(absl::string_view name, absl::string_view want,
                       const InferValue& value) {
  return absl::InvalidArgumentError(absl::StrCat(
      "parameters.", name, ": must be ", want, ", got ", KindOf(value)));
}

absl::StatusOr<int64_t> Int64Param(absl::string_view name,
                                   const InferValue& value) {
  if (const int64_t* v = std::get_if<int64_t>(&value)) return *v;
  return WrongType(name, "an int64", value);
}

absl::StatusOr<int32_t> Int32Param(absl::string_view name,
                                   const InferValue& value) {
  absl::StatusOr<int64_t> v = Int64Param(name, value);
  if (!v.ok()) return v.status();
  if (*v < std::numeric_limits<int32_t>::min() ||
      *v > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameters.", name, ": ", *v, " is out of range"));
  }
  return static_cast<int32_t>(*v);
}

absl::StatusOr<double> DoubleParam(absl::string_view name,
                                   const InferValue& value) {
  if (const double* v = std::get_if<double>(&value)) return *v;
  if (const int64_t* v = std::get_if<int64_t>(&value)) {
    return static_cast<double>(*v);
  }
  const std::string* text = std::get_if<std::string>(&value);
  if (text == nullptr) {
    return WrongType(name, "a double (or a string holding a number)", value);
  }
  double parsed = 0;
  if (!absl::SimpleAtod(*text, &parsed)) {
    return absl::InvalidArgumentError(absl::StrCat("parameters.", name, ": ",
                                                   QuotedForMessage(*text),
                                                   " is not a number"));
  }
  return parsed;
}

absl::StatusOr<bool> BoolParam(absl::string_view name,
                               const InferValue& value) {
  if (const bool* v = std::get_if<bool>(&value)) return *v;
  return WrongType(name, "a bool", value);
}

absl::StatusOr<LayerNormStyle> StyleParam(const InferValue& value) {
  const std::string* text = std::get_if<std::string>(&value);
  if (text == nullptr) return WrongType("style", "a string", value);
  if (*text == "pytorch") return LayerNormStyle::kPyTorch;
  if (*text == "bert") return LayerNormStyle::kBertUnbiasedStd;
  return absl::InvalidArgumentError(
      absl::StrCat("parameters.style: ", QuotedForMessage(*text),
                   " is not a style; use pytorch or bert"));
}

// One request parameter (not a tolerated one) into `call` for `model`,
// which takes `allowed`; `has_eps` is set when it is eps.
absl::Status TranslateParameter(const InferParameter& p,
                                absl::string_view model, unsigned allowed,
                                NativeInfer& call, bool& has_eps) {
  const std::string& name = p.name;
  const ParamName* known = nullptr;
  for (const ParamName& candidate : kParams) {
    if (name == candidate.name) known = &candidate;
  }
  if (known == nullptr || (allowed & known->param) == 0) {
    return absl::InvalidArgumentError(
        known == nullptr
            ? absl::StrCat("parameters: unknown parameter ",
                           QuotedForMessage(name), "; model ",
                           QuotedForMessage(model), " takes ",
                           ParamNames(allowed))
            : absl::StrCat("parameters.", name, ": does not apply to model ",
                           QuotedForMessage(model), ", which takes ",
                           ParamNames(allowed)));
  }
  NormalizeSpec& spec = call.normalize;
  switch (known->param) {
    case kNormalizedNdim: {
      absl::StatusOr<int32_t> v = Int32Param(name, p.value);
      if (v.ok()) spec.normalized_ndim = *v;
      return v.status();
    }
    case kEps: {
      absl::StatusOr<double> v = DoubleParam(name, p.value);
      if (v.ok()) spec.eps = *v;
      has_eps = true;
      return v.status();
    }
    case kNumGroups: {
      absl::StatusOr<int64_t> v = Int64Param(name, p.value);
      if (v.ok()) spec.num_groups = *v;
      return v.status();
    }
    case kChannelAxis: {
      absl::StatusOr<int32_t> v = Int32Param(name, p.value);
      if (v.ok()) {
        spec.channel_axis = *v;
        call.fit_spec.channel_axis = *v;
      }
      return v.status();
    }
    case kStyle: {
      absl::StatusOr<LayerNormStyle> v = StyleParam(p.value);
      if (v.ok()) spec.layer_norm_style = *v;
      return v.status();
    }
    case kTraining: {
      absl::StatusOr<bool> v = BoolParam(name, p.value);
      if (v.ok()) spec.training = *v;
      return v.status();
    }
    case kFit: {
      absl::StatusOr<bool> v = BoolParam(name, p.value);
      if (v.ok()) call.fit = *v;
      return v.status();
    }
  }
  return absl::OkStatus();
}

// The request parameters into `call` for `model`, which takes `allowed`.
// Of several problems the one whose parameter name sorts first is
// reported, so that it is always the same; one pass, whatever their number.
absl::Status TranslateParameters(const InferParameters& parameters,
                                 absl::string_view model, unsigned allowed,
                                 NativeInfer& call) {
  bool has_eps = false;
  const InferParameter* first_bad = nullptr;
  absl::Status first_error;
  for (const InferParameter& p : parameters) {
    if (IsOneOf(p.name, kToleratedRequestParams)) continue;
    absl::Status status = TranslateParameter(p, model, allowed, call, has_eps);
    if (!status.ok() && (first_bad == nullptr || p.name < first_bad->name)) {
      first_bad = &p;
      first_error = std::move(status);
    }
  }
  if (first_bad != nullptr) return first_error;
  const NormalizeSpec& spec = call.normalize;
  if (call.fit && (spec.training || has_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters.", spec.training ? "training" : "eps",
        ": does not apply with fit (which updates the model's statistics "
        "and normalizes nothing)"));
  }
  return absl::OkStatus();
}

// The first parameter of `parameters` (in name order) that is not one of
// `tolerated`, or nullptr.
template <size_t N>
const InferParameter* FirstUnknown(const InferParameters& parameters,
                                   const char* const (&tolerated)[N]) {
  const InferParameter* first = nullptr;
  for (const InferParameter& p : parameters) {
    if (IsOneOf(p.name, tolerated)) continue;
    if (first == nullptr || p.name < first->name) first = &p;
  }
  return first;
}

constexpr const char* kRoles[] = {"input", "weight", "bias"};

// Each input's role (index into kRoles) and dtype, checked.
absl::Status TranslateInputs(const InferRequest& request, NativeInfer& call,
                             absl::InlinedVector<int, 3>& roles,
                             absl::InlinedVector<DType, 3>& dtypes) {
  bool seen[3] = {false, false, false};
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const InferInput& input = request.inputs[i];
    const std::string field = absl::StrCat("inputs[", i, "]");
    int role = 0;
    while (role < 3 && input.name != kRoles[role]) ++role;
    if (role == 3) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name: unknown input ", QuotedForMessage(input.name),
          "; the model takes input, weight and bias"));
    }
    if (seen[role]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: a second input named ", kRoles[role]));
    }
    seen[role] = true;
    const std::optional<DType> dtype = OipDatatype(input.datatype);
    if (!dtype.has_value()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".datatype: ", QuotedForMessage(input.datatype),
                       " is not supported; use FP32, FP64, FP16 or BF16"));
    }
    if (const InferParameter* unknown =
            FirstUnknown(input.parameters, kToleratedInputParams)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".parameters: unknown tensor parameter ",
                       QuotedForMessage(unknown->name)));
    }
    if (role != 0 && call.fit) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name: ", kRoles[role],
                       " does not apply with fit, which normalizes nothing"));
    }
    roles.push_back(role);
    dtypes.push_back(*dtype);
  }
  if (!seen[0]) {
    return absl::InvalidArgumentError(
        "inputs: no input named \"input\" (the tensor to normalize)");
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const InferRequest& request) {
  for (size_t k = 0; k < request.outputs.size(); ++k) {
    const InferRequestedOutput& output = request.outputs[k];
    const std::string field = absl::StrCat("outputs[", k, "]");
    if (output.name != "output") {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".name: unknown output ", QuotedForMessage(output.name),
          "; the model has output"));
    }
    const InferParameter* unknown =
        FirstUnknown(output.parameters, kToleratedOutputParams);
    if (unknown == nullptr) continue;
    if (unknown->name == "classification") {
      return absl::InvalidArgumentError(absl::StrCat(
          field,
          ".parameters.classification: not supported; normd's output is the "
          "normalized tensor, not classes"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(field, ".parameters: unknown output parameter ",
                     QuotedForMessage(unknown->name)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TranslateInfer(const InferRequest& request, NativeInfer& call) {
  if (request.model_name.empty()) {
    return absl::InvalidArgumentError("model_name: required");
  }
  const std::optional<NormMode> builtin = BuiltinOipModel(request.model_name);
  call.batch_norm = !builtin.has_value();
  if (absl::Status s = TranslateParameters(
          request.parameters, request.model_name, ParamsOf(builtin), call);
      !s.ok()) {
    return s;
  }
  // One per input; a valid request has at most three.
  absl::InlinedVector<int, 3> roles;
  absl::InlinedVector<DType, 3> dtypes;
  if (absl::Status s = TranslateInputs(request, call, roles, dtypes); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckOutputs(request); !s.ok()) return s;
  if (absl::Status s = CheckOipVersion(request.model_version,
                                       request.model_name, "model_version");
      !s.ok()) {
    return s;
  }
  NormalizeSpec& spec = call.normalize;
  spec.mode = builtin.value_or(NormMode::kBatchNorm);
  if (call.batch_norm) spec.model = request.model_name;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const InferInput& input = request.inputs[i];
    const int role = roles[i];
    InputTensor view;
    if (absl::Status s =
            ViewTensorBytes(dtypes[i], input.shape, input.data,
                            absl::StrCat("inputs[", i, "].shape"),
                            input.data_field, call.storage[role], view);
        !s.ok()) {
      return s;
    }
    if (role == 0) {
      call.output.datatype = input.datatype;
      call.output.dtype = view.dtype;
      call.output.shape = view.shape;
      call.output.elements = view.size;
      call.output.bytes = view.size * ElementSize(view.dtype);
      spec.input = std::move(view);
      continue;
    }
    std::optional<AffineParam>& param = role == 1 ? spec.weight : spec.bias;
    param = AffineParam{.shape = view.shape, .values = TensorToDoubles(view)};
  }
  if (call.fit) {
    call.fit_spec.model = request.model_name;
    call.fit_spec.input = spec.input;
    call.output = InferOutputPlan();
    call.output.has_output = false;
  }
  return absl::OkStatus();
}

}  // namespace normd

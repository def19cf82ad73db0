#include "client/checkpoint/onnx_layers.h"

#include <fcntl.h>
#include <google/protobuf/io/zero_copy_stream_impl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/checkpoint/layer_values.h"

namespace normd::client {
namespace {

// The shortest decimal that reads back as `value` in float32, as a double:
// PyTorch's eps=1e-5 is exported as the float nearest 1e-5, and comes back
// as 1e-5 rather than 9.99999974737875e-06.
double ShortestDecimal(float value) {
  char text[64];
  const std::to_chars_result end =
      std::to_chars(text, text + sizeof(text), value);
  double out = value;
  std::from_chars(text, end.ptr, out);
  return out;
}

// PyTorch's momentum m for an ONNX momentum attribute (1 - m, in float32):
// the shortest decimal m for which float(1 - m) is the attribute.
double TorchMomentum(float onnx_momentum) {
  const double exact = 1.0 - static_cast<double>(onnx_momentum);
  for (int digits = 1; digits <= 17; ++digits) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.*g", digits, exact);
    double candidate = exact;
    std::from_chars(text, text + std::strlen(text), candidate);
    if (static_cast<float>(1.0 - candidate) == onnx_momentum) return candidate;
  }
  return exact;
}

// The values of a [C] float initializer, raw or typed.
absl::StatusOr<LayerTensor> InitializerValues(const onnx::TensorProto& tensor,
                                              absl::string_view context) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, " tensor '", tensor.name(), "' ", parts...));
  };
  if (tensor.data_location() == onnx::TensorProto::EXTERNAL ||
      tensor.external_data_size() > 0) {
    std::string location;
    for (const onnx::StringStringEntryProto& entry : tensor.external_data()) {
      if (entry.key() == "location") location = entry.value();
    }
    return fail("keeps its data in the external file '", location,
                "' (ONNX external data); normctl reads self-contained models: "
                "save with onnx.save_model(model, path, "
                "save_as_external_data=False)");
  }
  if (tensor.dims_size() != 1 || tensor.dims(0) < 0) {
    return fail("has shape [", absl::StrJoin(tensor.dims(), ", "),
                "]; a BatchNorm statistic is [C]");
  }
  const int64_t count = tensor.dims(0);
  LayerTensor out{.source = tensor.name(), .values = {}};
  const std::string& raw = tensor.raw_data();
  FloatKind kind;
  switch (tensor.data_type()) {
    case onnx::TensorProto::FLOAT:
      kind = FloatKind::kFloat32;
      break;
    case onnx::TensorProto::DOUBLE:
      kind = FloatKind::kFloat64;
      break;
    case onnx::TensorProto::FLOAT16:
      kind = FloatKind::kFloat16;
      break;
    case onnx::TensorProto::BFLOAT16:
      kind = FloatKind::kBFloat16;
      break;
    default:
      return fail("has data type ", tensor.data_type(),
                  "; BatchNorm statistics must be float, double, float16 or "
                  "bfloat16");
  }
  const int64_t element_bytes = ElementBytes(kind);
  const int64_t typed = tensor.data_type() == onnx::TensorProto::FLOAT
                            ? tensor.float_data_size()
                        : tensor.data_type() == onnx::TensorProto::DOUBLE
                            ? tensor.double_data_size()
                            : tensor.int32_data_size();
  const bool use_raw = tensor.has_raw_data();
  // Compared by division: a declared dim may be near INT64_MAX.
  if (use_raw ? raw.size() % element_bytes != 0 ||
                    static_cast<int64_t>(raw.size() / element_bytes) != count
              : typed != count) {
    return fail("holds ",
                use_raw ? absl::StrCat(raw.size(), " bytes")
                        : absl::StrCat(typed, " values"),
                " where its shape is [", count, "] of ",
                use_raw ? absl::StrCat(element_bytes, "-byte values")
                        : std::string("values"));
  }
  out.values.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    const int index = static_cast<int>(i);
    // Typed 16-bit values keep their bit patterns in int32_data.
    out.values.push_back(
        use_raw                       ? WidenElement(kind, raw.data(), i)
        : kind == FloatKind::kFloat32 ? tensor.float_data(index)
        : kind == FloatKind::kFloat64
            ? tensor.double_data(index)
            : SixteenBitsToDouble(
                  kind, static_cast<uint16_t>(tensor.int32_data(index))));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointLayer>> LayersFromOnnx(
    const onnx::ModelProto& model, absl::string_view file_name) {
  const onnx::GraphProto& graph = model.graph();
  // Stored tensors by name: initializers, Constant nodes' values, and the
  // outputs of Identity nodes (the exporter shares equal initializers
  // through them), followed to what they copy.
  absl::flat_hash_map<absl::string_view, const onnx::TensorProto*> initializers;
  for (const onnx::TensorProto& tensor : graph.initializer()) {
    initializers.try_emplace(tensor.name(), &tensor);
  }
  absl::flat_hash_map<absl::string_view, absl::string_view> identities;
  for (const onnx::NodeProto& node : graph.node()) {
    if (node.op_type() == "Identity" && node.input_size() == 1 &&
        node.output_size() == 1) {
      identities.try_emplace(node.output(0), node.input(0));
    }
    if (node.op_type() == "Constant" && node.output_size() == 1) {
      for (const onnx::AttributeProto& attribute : node.attribute()) {
        if (attribute.name() == "value" && attribute.has_t()) {
          initializers.try_emplace(node.output(0), &attribute.t());
        }
      }
    }
  }
  const auto stored = [&](absl::string_view name) -> const onnx::TensorProto* {
    for (int hops = 0; hops <= graph.node_size(); ++hops) {
      if (auto it = initializers.find(name); it != initializers.end()) {
        return it->second;
      }
      auto copy = identities.find(name);
      if (copy == identities.end()) return nullptr;
      name = copy->second;
    }
    return nullptr;  // A cycle of Identity nodes.
  };
  std::vector<CheckpointLayer> layers;
  for (int n = 0; n < graph.node_size(); ++n) {
    const onnx::NodeProto& node = graph.node(n);
    if (node.op_type() != "BatchNormalization" ||
        !(node.domain().empty() || node.domain() == "ai.onnx")) {
      continue;
    }
    const std::string context =
        absl::StrCat(file_name, ": node '",
                     node.name().empty() ? absl::StrCat("#", n) : node.name(),
                     "' (BatchNormalization):");
    if (node.input_size() < 5) {
      return absl::InvalidArgumentError(
          absl::StrCat(context, " has ", node.input_size(), " inputs, not 5"));
    }
    // Inputs 1-4: scale, B, input_mean, input_var.
    const char* const kRoles[] = {"scale", "B", "input_mean", "input_var"};
    LayerTensor values[4];
    for (int i = 0; i < 4; ++i) {
      const std::string& input = node.input(i + 1);
      const onnx::TensorProto* tensor = stored(input);
      if (tensor == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            context, " its ", kRoles[i], " '", input,
            "' is not an initializer: normctl imports statistics stored in "
            "the model, not computed by it"));
      }
      absl::StatusOr<LayerTensor> read = InitializerValues(*tensor, context);
      if (!read.ok()) return read.status();
      values[i] = *std::move(read);
      values[i].source = input;  // The node's name for it, not the shared one.
    }
    CheckpointLayer layer;
    absl::string_view name = values[2].source;
    if (!absl::ConsumeSuffix(&name, ".running_mean")) {
      name = node.name().empty() ? values[2].source : node.name();
    }
    layer.layer = std::string(name);
    layer.weight = std::move(values[0]);
    layer.bias = std::move(values[1]);
    layer.running_mean = std::move(values[2]);
    layer.running_var = std::move(values[3]);
    float epsilon = 1e-5f, momentum = 0.9f;  // ONNX's defaults.
    for (const onnx::AttributeProto& attribute : node.attribute()) {
      if (attribute.name() != "epsilon" && attribute.name() != "momentum") {
        continue;
      }
      if (attribute.type() != onnx::AttributeProto::FLOAT) {
        return absl::InvalidArgumentError(absl::StrCat(
            context, " attribute '", attribute.name(), "' is not a float"));
      }
      (attribute.name() == "epsilon" ? epsilon : momentum) = attribute.f();
    }
    layer.eps = ShortestDecimal(epsilon);
    layer.momentum = TorchMomentum(momentum);
    if (absl::Status s = CheckLayer(layer, file_name); !s.ok()) return s;
    layers.push_back(std::move(layer));
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        file_name,
        ": no BatchNorm layer found (no BatchNormalization node "
        "in the main graph of ",
        graph.node_size(),
        " nodes; torch.onnx.export folds BatchNorm into convolutions in eval "
        "mode: export with training=torch.onnx.TrainingMode.PRESERVE)"));
  }
  return layers;
}

absl::StatusOr<std::vector<CheckpointLayer>> ReadOnnxLayers(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  onnx::ModelProto model;
  bool parsed;
  {
    google::protobuf::io::FileInputStream input(fd);
    parsed = model.ParseFromZeroCopyStream(&input);
  }
  close(fd);
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": not an ONNX model (it does not parse as onnx.ModelProto)"));
  }
  return LayersFromOnnx(model, path);
}

}  // namespace normd::client

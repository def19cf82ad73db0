#include "client/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/btree_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/checkpoint/layer_values.h"
#include "client/checkpoint/onnx_layers.h"

namespace normd::client {
namespace {

// The tensors of one layer in a state_dict, by their last key component.
struct LayerKeys {
  const SafetensorsTensor* running_mean = nullptr;
  const SafetensorsTensor* running_var = nullptr;
  const SafetensorsTensor* weight = nullptr;
  const SafetensorsTensor* bias = nullptr;
  const SafetensorsTensor* num_batches_tracked = nullptr;
};

// A per-channel statistic: a [C] tensor of a float dtype, widened exactly.
absl::StatusOr<LayerTensor> ChannelValues(const SafetensorsTensor& tensor,
                                          absl::string_view file_name) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": tensor '", tensor.name, "' ", parts...));
  };
  if (tensor.shape.size() != 1) {
    return fail("has shape ", ShapeText(tensor.shape),
                "; a BatchNorm statistic is [C]");
  }
  FloatKind kind;
  if (tensor.dtype == "F32") {
    kind = FloatKind::kFloat32;
  } else if (tensor.dtype == "F64") {
    kind = FloatKind::kFloat64;
  } else if (tensor.dtype == "F16") {
    kind = FloatKind::kFloat16;
  } else if (tensor.dtype == "BF16") {
    kind = FloatKind::kBFloat16;
  } else {
    return fail("is ", tensor.dtype,
                "; BatchNorm statistics must be F32, F64, F16 or BF16");
  }
  LayerTensor out{.source = tensor.name, .values = {}};
  const int64_t count = tensor.shape[0];
  out.values.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) {
    out.values.push_back(WidenElement(kind, tensor.data.data(), i));
  }
  return out;
}

// PyTorch's counter: an I64 (or I32) scalar >= 0.
absl::StatusOr<int64_t> CounterValue(const SafetensorsTensor& tensor,
                                     absl::string_view file_name) {
  int64_t value = -1;
  const bool scalar = tensor.shape.empty() ||
                      (tensor.shape.size() == 1 && tensor.shape[0] == 1);
  if (scalar && tensor.dtype == "I64") {
    value = LoadLittleEndian<int64_t>(tensor.data.data());
  } else if (scalar && tensor.dtype == "I32") {
    value = LoadLittleEndian<int32_t>(tensor.data.data());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": tensor '", tensor.name, "' is ",
                     tensor.dtype, " of shape ", ShapeText(tensor.shape),
                     "; num_batches_tracked is an I64 scalar"));
  }
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name, ": tensor '", tensor.name, "' is ", value,
                     "; num_batches_tracked must be >= 0"));
  }
  return value;
}

// An open file mapped read-only; unmapped when destroyed. Not shared.
class MappedFile {
 public:
  static absl::StatusOr<MappedFile> Open(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return absl::NotFoundError(
          absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
    }
    struct stat info;
    if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a regular file"));
    }
    MappedFile file;
    file.size_ = static_cast<size_t>(info.st_size);
    if (file.size_ > 0) {
      void* map = mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (map == MAP_FAILED) {
        const int error = errno;
        close(fd);
        return absl::UnavailableError(absl::StrCat(
            path, ": cannot map the file (", std::strerror(error), ")"));
      }
      file.data_ = static_cast<const char*>(map);
    }
    close(fd);
    return file;
  }
  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&&) = delete;
  ~MappedFile() {
    if (data_ != nullptr) munmap(const_cast<char*>(data_), size_);
  }
  absl::string_view bytes() const {
    return {data_ == nullptr ? "" : data_, size_};
  }

 private:
  MappedFile() = default;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

std::string FormatsHelp() {
  return "normctl reads .safetensors files (a state_dict saved with "
         "safetensors.torch.save_file) and .onnx models; for a module in "
         "Python, use normd.Client.import_module(module, prefix)";
}

}  // namespace

absl::StatusOr<std::vector<CheckpointLayer>> LayersFromSafetensors(
    const std::vector<SafetensorsTensor>& tensors,
    absl::string_view file_name) {
  absl::btree_map<std::string, LayerKeys> by_layer;
  for (const SafetensorsTensor& tensor : tensors) {
    const size_t dot = tensor.name.rfind('.');
    const absl::string_view key = tensor.name;
    const std::string layer =
        dot == std::string::npos ? "" : tensor.name.substr(0, dot);
    const absl::string_view last =
        dot == std::string::npos ? key : key.substr(dot + 1);
    const SafetensorsTensor** slot = nullptr;
    LayerKeys& keys = by_layer[layer];
    if (last == "running_mean") slot = &keys.running_mean;
    if (last == "running_var") slot = &keys.running_var;
    if (last == "weight") slot = &keys.weight;
    if (last == "bias") slot = &keys.bias;
    if (last == "num_batches_tracked") slot = &keys.num_batches_tracked;
    if (slot != nullptr) *slot = &tensor;
  }
  std::vector<CheckpointLayer> layers;
  for (const auto& entry : by_layer) {
    // Named, not bound: clang 14 lambdas cannot capture structured bindings.
    const std::string& name = entry.first;
    const LayerKeys& keys = entry.second;
    const auto fail = [&](auto&&... parts) {
      return absl::InvalidArgumentError(
          absl::StrCat(file_name, ": layer '", name, "': ", parts...));
    };
    const std::string key_prefix = name.empty() ? "" : name + ".";
    if (keys.running_mean == nullptr && keys.running_var == nullptr) {
      if (keys.num_batches_tracked != nullptr) {
        return fail("has '", keys.num_batches_tracked->name,
                    "' but neither running_mean nor running_var");
      }
      continue;  // Not a BatchNorm layer (a convolution's weight, ...).
    }
    if (keys.running_mean == nullptr || keys.running_var == nullptr) {
      const bool has_mean = keys.running_mean != nullptr;
      return fail("has '", key_prefix,
                  has_mean ? "running_mean" : "running_var", "' but no '",
                  key_prefix, has_mean ? "running_var" : "running_mean", "'");
    }
    CheckpointLayer layer;
    layer.layer = name;
    for (auto [tensor, out] :
         {std::pair{keys.running_mean, &layer.running_mean},
          std::pair{keys.running_var, &layer.running_var},
          std::pair{keys.weight, &layer.weight},
          std::pair{keys.bias, &layer.bias}}) {
      if (tensor == nullptr) continue;
      absl::StatusOr<LayerTensor> values = ChannelValues(*tensor, file_name);
      if (!values.ok()) return values.status();
      *out = *std::move(values);
    }
    if (keys.num_batches_tracked != nullptr) {
      absl::StatusOr<int64_t> count =
          CounterValue(*keys.num_batches_tracked, file_name);
      if (!count.ok()) return count.status();
      layer.num_batches_tracked = *count;
    }
    if (absl::Status s = CheckLayer(layer, file_name); !s.ok()) return s;
    layers.push_back(std::move(layer));
  }
  if (layers.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file_name,
                     ": no BatchNorm layer found (no pair of tensors named "
                     "<layer>.running_mean and <layer>.running_var among its ",
                     tensors.size(), ")"));
  }
  return layers;
}

absl::StatusOr<std::vector<CheckpointLayer>> ReadCheckpoint(
    const std::string& path, uint64_t max_header_bytes) {
  const std::string lower = absl::AsciiStrToLower(path);
  for (const char* pickle : {".pt", ".pth", ".bin", ".ckpt", ".pkl", ".tar"}) {
    if (absl::EndsWith(lower, pickle)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": a PyTorch pickle (", pickle,
                       ") is not read: ", FormatsHelp()));
    }
  }
  if (absl::EndsWith(lower, ".onnx")) return ReadOnnxLayers(path);
  if (!absl::EndsWith(lower, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unknown kind of file: ", FormatsHelp()));
  }
  absl::StatusOr<MappedFile> file = MappedFile::Open(path);
  if (!file.ok()) return file.status();
  // A pickle saved under this name: a zip archive (torch.save) or pickle
  // protocol 2-5, where a safetensors header would start.
  const absl::string_view bytes = file->bytes();
  const bool header_follows = bytes.size() > 8 && bytes[8] == '{';
  if (!header_follows && (absl::StartsWith(bytes, "PK\x03\x04") ||
                          (bytes.size() > 1 && bytes[0] == '\x80' &&
                           bytes[1] >= 2 && bytes[1] <= 5))) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": this is a PyTorch pickle, not safetensors: ", FormatsHelp()));
  }
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ParseSafetensors(file->bytes(), path, max_header_bytes);
  if (!tensors.ok()) return tensors.status();
  return LayersFromSafetensors(*tensors, path);
}

std::string ModelNameOf(absl::string_view prefix, absl::string_view layer) {
  return layer.empty() ? std::string(prefix) : absl::StrCat(prefix, ".", layer);
}

v1::CreateModelsRequest CreateModelsFor(
    const std::vector<CheckpointLayer>& layers, absl::string_view prefix,
    const LayerOverrides& overrides) {
  v1::CreateModelsRequest request;
  for (const CheckpointLayer& layer : layers) {
    v1::CreateModelRequest& model = *request.add_models();
    model.set_name(ModelNameOf(prefix, layer.layer));
    model.set_num_features(
        static_cast<int64_t>(layer.running_mean.values.size()));
    const std::optional<double> momentum =
        overrides.momentum.has_value() ? overrides.momentum : layer.momentum;
    if (momentum.has_value()) model.set_momentum(*momentum);
    model.set_cumulative_average(overrides.cumulative_average);
    const std::optional<double> eps =
        overrides.eps.has_value() ? overrides.eps : layer.eps;
    if (eps.has_value()) model.set_eps(*eps);
    model.mutable_running_mean()->Assign(layer.running_mean.values.begin(),
                                         layer.running_mean.values.end());
    model.mutable_running_var()->Assign(layer.running_var.values.begin(),
                                        layer.running_var.values.end());
    model.mutable_weight()->Assign(layer.weight.values.begin(),
                                   layer.weight.values.end());
    model.mutable_bias()->Assign(layer.bias.values.begin(),
                                 layer.bias.values.end());
    model.set_num_batches_tracked(layer.num_batches_tracked);
    // The trained statistics are what the model's inputs should follow.
    model.set_reference_from_checkpoint(true);
  }
  return request;
}

absl::StatusOr<std::vector<SafetensorsOutput>> StateDictOf(
    const std::vector<v1::ModelState>& models, absl::string_view prefix) {
  std::vector<SafetensorsOutput> out;
  for (const v1::ModelState& model : models) {
    absl::string_view layer = model.name();
    if (!absl::ConsumePrefix(&layer, prefix) ||
        !(layer.empty() || absl::ConsumePrefix(&layer, "."))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", model.name(), "' is not under the prefix '", prefix, "'"));
    }
    const std::string key = layer.empty() ? "" : absl::StrCat(layer, ".");
    const auto add_floats = [&](absl::string_view field,
                                const auto& values) -> absl::Status {
      SafetensorsOutput tensor{.name = absl::StrCat(key, field),
                               .dtype = "F32",
                               .shape = {static_cast<int64_t>(values.size())},
                               .data = {}};
      tensor.data.reserve(4 * values.size());
      for (int i = 0; i < values.size(); ++i) {
        const float value = static_cast<float>(values[i]);
        if (!std::isfinite(value)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "model '", model.name(), "': ", field, "[", i, "] = ", values[i],
              " does not fit float32, the dtype of PyTorch's buffers"));
        }
        uint32_t bits;
        std::memcpy(&bits, &value, sizeof(bits));
        for (int b = 0; b < 4; ++b) {
          tensor.data += static_cast<char>((bits >> (8 * b)) & 0xff);
        }
      }
      out.push_back(std::move(tensor));
      return absl::OkStatus();
    };
    for (const auto& [field, values] :
         {std::pair{"running_mean", &model.running_mean()},
          std::pair{"running_var", &model.running_var()},
          std::pair{"weight", &model.weight()},
          std::pair{"bias", &model.bias()}}) {
      if (absl::Status s = add_floats(field, *values); !s.ok()) return s;
    }
    SafetensorsOutput counter{.name = absl::StrCat(key, "num_batches_tracked"),
                              .dtype = "I64",
                              .shape = {},
                              .data = {}};
    const uint64_t count = static_cast<uint64_t>(model.num_batches_tracked());
    for (int b = 0; b < 8; ++b) {
      counter.data += static_cast<char>((count >> (8 * b)) & 0xff);
    }
    out.push_back(std::move(counter));
  }
  std::sort(out.begin(), out.end(),
            [](const SafetensorsOutput& a, const SafetensorsOutput& b) {
              return a.name < b.name;
            });
  return out;
}

}  // namespace normd::client

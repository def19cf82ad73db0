#include "server/rpc/convert.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/half.h"
#include "server/rpc/drift_convert.h"

namespace normd {
namespace {

absl::StatusOr<DType> ParseDType(v1::DataType dtype, absl::string_view field) {
  switch (dtype) {
    case v1::DATA_TYPE_UNSPECIFIED:
    case v1::FLOAT32:
      return DType::kFloat32;
    case v1::FLOAT64:
      return DType::kFloat64;
    case v1::BFLOAT16:
      return DType::kBFloat16;
    case v1::FLOAT16:
      return DType::kFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".dtype: unknown DataType value ", static_cast<int>(dtype)));
  }
}

std::string ShapeString(const v1::Tensor& tensor) {
  return normd::ShapeString(
      absl::MakeConstSpan(tensor.shape().data(), tensor.shape().size()));
}

// Parses an optional affine parameter (weight / bias) into fp64 values.
absl::Status ParseAffine(const v1::Tensor& tensor, absl::string_view field,
                         std::optional<AffineParam>& out) {
  ParsedTensor parsed;
  if (absl::Status s = ParseTensor(tensor, field, parsed); !s.ok()) return s;
  out = AffineParam{.shape = parsed.view.shape,
                    .values = TensorToDoubles(parsed.view)};
  return absl::OkStatus();
}

absl::StatusOr<NormMode> ParseMode(v1::Mode mode) {
  switch (mode) {
    case v1::LAYER_NORM:
      return NormMode::kLayerNorm;
    case v1::BATCH_NORM:
      return NormMode::kBatchNorm;
    case v1::GROUP_NORM:
      return NormMode::kGroupNorm;
    case v1::INSTANCE_NORM:
      return NormMode::kInstanceNorm;
    case v1::RMS_NORM:
      return NormMode::kRmsNorm;
    case v1::L2_NORM:
      return NormMode::kL2Norm;
    case v1::WEIGHT_NORM:
      return NormMode::kWeightNorm;
    case v1::MODE_UNSPECIFIED:
      return absl::InvalidArgumentError(
          "mode: must be set (LAYER_NORM, BATCH_NORM, GROUP_NORM, "
          "INSTANCE_NORM, RMS_NORM, L2_NORM or WEIGHT_NORM)");
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("mode: unknown Mode value ", static_cast<int>(mode)));
  }
}

absl::StatusOr<LayerNormStyle> ParseStyle(v1::LayerNormStyle style) {
  switch (style) {
    case v1::LAYER_NORM_STYLE_UNSPECIFIED:
    case v1::PYTORCH:
      return LayerNormStyle::kPyTorch;
    case v1::BERT_UNBIASED_STD:
      return LayerNormStyle::kBertUnbiasedStd;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("layer_norm_style: unknown LayerNormStyle value ",
                       static_cast<int>(style)));
  }
}

}  // namespace

absl::Status ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                         ParsedTensor& out,
                         std::optional<absl::string_view> data,
                         const ScatteredBytes* scattered) {
  const absl::string_view bytes = data.has_value() ? *data : tensor.data();
  const int64_t data_size = scattered != nullptr
                                ? scattered->size()
                                : static_cast<int64_t>(bytes.size());
  absl::StatusOr<DType> dtype = ParseDType(tensor.dtype(), field);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<int64_t> count =
      NumElements(tensor.shape(), absl::StrCat(field, ".shape"));
  if (!count.ok()) return count.status();
  const bool has_data = data_size > 0;
  const bool has_values = tensor.values_size() > 0;
  if (has_data && has_values) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": set exactly one of data and values, not both"));
  }
  if (*count == 0 && (has_data || has_values)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": shape ", ShapeString(tensor),
        " has zero elements, so neither data nor values may be set"));
  }
  if (*count > 0 && !has_data && !has_values) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": shape ", ShapeString(tensor), " has ", *count,
                     " elements but neither data nor values is set"));
  }
  out.view.dtype = *dtype;
  out.view.shape.assign(tensor.shape().begin(), tensor.shape().end());
  out.view.size = *count;
  out.values_form = has_values;
  if (has_values) {
    if (tensor.values_size() != *count) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".values: has ", tensor.values_size(), " values but shape ",
          ShapeString(tensor), " needs ", *count));
    }
    if (*dtype == DType::kFloat32) {
      out.storage_f32.assign(tensor.values().begin(), tensor.values().end());
      out.view.data = out.storage_f32.data();
    } else if (IsHalf(*dtype)) {
      out.storage_u16.resize(*count);
      for (int64_t i = 0; i < *count; ++i) {
        out.storage_u16[i] = DoubleToHalf(*dtype, tensor.values(i));
      }
      out.view.data = out.storage_u16.data();
    } else {
      out.storage.assign(tensor.values().begin(), tensor.values().end());
      out.view.data = out.storage.data();
    }
    return absl::OkStatus();
  }
  TensorBytes tensor_bytes;
  if (scattered != nullptr) {
    tensor_bytes.scattered = scattered;
  } else {
    tensor_bytes.contiguous = bytes;
  }
  return ViewTensorBytes(
      *dtype, out.view.shape, tensor_bytes, absl::StrCat(field, ".shape"),
      absl::StrCat(field, ".data"), out.storage_bytes, out.view);
}

absl::Status ParseNormalizeRequest(const v1::NormalizeRequest& request,
                                   ParsedNormalize& out,
                                   std::optional<absl::string_view> input_data,
                                   const ScatteredBytes* scattered_input) {
  absl::StatusOr<NormMode> mode = ParseMode(request.mode());
  if (!mode.ok()) return mode.status();
  absl::StatusOr<LayerNormStyle> style = ParseStyle(request.layer_norm_style());
  if (!style.ok()) return style.status();
  if (absl::Status s = ParseTensor(request.input(), "input", out.input,
                                   input_data, scattered_input);
      !s.ok()) {
    return s;
  }
  NormalizeSpec& spec = out.spec;
  spec.mode = *mode;
  spec.layer_norm_style = *style;
  spec.model = request.model();
  spec.input = out.input.view;
  spec.training = request.training();
  if (request.has_channel_axis()) spec.channel_axis = request.channel_axis();
  spec.normalized_ndim = request.normalized_ndim();
  spec.num_groups = request.num_groups();
  if (request.has_eps()) spec.eps = request.eps();
  if (request.has_weight()) {
    if (absl::Status s = ParseAffine(request.weight(), "weight", spec.weight);
        !s.ok()) {
      return s;
    }
  }
  if (request.has_bias()) {
    if (absl::Status s = ParseAffine(request.bias(), "bias", spec.bias);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParseFitRequest(const v1::FitRequest& request, ParsedFit& out) {
  if (absl::Status s = ParseTensor(request.input(), "input", out.input);
      !s.ok()) {
    return s;
  }
  out.spec.model = request.model();
  out.spec.input = out.input.view;
  if (request.has_channel_axis()) {
    out.spec.channel_axis = request.channel_axis();
  }
  return absl::OkStatus();
}

ModelSpec ToModelSpec(const v1::CreateModelRequest& request) {
  ModelSpec spec;
  spec.name = request.name();
  spec.num_features = request.num_features();
  if (request.has_momentum()) spec.momentum = request.momentum();
  spec.cumulative_average = request.cumulative_average();
  if (request.has_eps()) spec.eps = request.eps();
  spec.running_mean.assign(request.running_mean().begin(),
                           request.running_mean().end());
  spec.running_var.assign(request.running_var().begin(),
                          request.running_var().end());
  spec.weight.assign(request.weight().begin(), request.weight().end());
  spec.bias.assign(request.bias().begin(), request.bias().end());
  spec.num_batches_tracked = request.num_batches_tracked();
  spec.use_pooled_statistics = request.use_pooled_statistics();
  spec.reference_from_running = request.reference_from_checkpoint();
  return spec;
}

ModelStateSpec ToModelStateSpec(const v1::ModelState& state) {
  ModelStateSpec out;
  ModelSpec& config = out.config;
  config.name = state.name();
  config.num_features = state.num_features();
  config.momentum = state.momentum();
  config.cumulative_average = state.cumulative_average();
  config.eps = state.eps();
  config.use_pooled_statistics = state.use_pooled_statistics();
  config.num_batches_tracked = state.num_batches_tracked();
  for (auto [from, to] :
       {std::pair{&state.running_mean(), &config.running_mean},
        std::pair{&state.running_var(), &config.running_var},
        std::pair{&state.weight(), &config.weight},
        std::pair{&state.bias(), &config.bias},
        std::pair{&state.mean(), &out.pooled_mean},
        std::pair{&state.pooled_m2(), &out.pooled_m2},
        std::pair{&state.var(), &out.pooled_var}}) {
    to->assign(from->begin(), from->end());
  }
  out.sample_count = state.sample_count();
  out.generation = state.generation();
  out.reference = ToDriftReference(state);
  return out;
}

void ToModelState(const BatchNormModel& model, bool with_arrays,
                  v1::ModelState& state) {
  state.set_name(model.name);
  state.set_num_features(model.num_features);
  state.set_momentum(model.momentum);
  state.set_cumulative_average(model.cumulative_average);
  state.set_eps(model.eps);
  state.set_use_pooled_statistics(model.use_pooled_statistics);
  state.set_num_batches_tracked(model.num_batches_tracked);
  state.set_sample_count(model.sample_count);
  state.set_generation(model.generation);
  if (model.reference.has_value()) {
    ToDriftReferenceMessage(*model.reference, /*with_arrays=*/false,
                            *state.mutable_reference());
  }
  if (!with_arrays) return;
  state.mutable_running_mean()->Assign(model.running_mean.begin(),
                                       model.running_mean.end());
  state.mutable_running_var()->Assign(model.running_var.begin(),
                                      model.running_var.end());
  state.mutable_weight()->Assign(model.weight.begin(), model.weight.end());
  state.mutable_bias()->Assign(model.bias.begin(), model.bias.end());
  for (const Moments& m : model.pooled) {
    state.add_mean(m.mean);
    state.add_var(m.BiasedVariance());
  }
}

void WithReferenceArrays(const BatchNormModel& model, v1::ModelState& state) {
  if (!model.reference.has_value()) return;
  ToDriftReferenceMessage(*model.reference, /*with_arrays=*/true,
                          *state.mutable_reference());
}

void SetOutputMeta(const v1::Tensor& request_tensor, v1::Tensor& out) {
  out.set_dtype(request_tensor.dtype());
  *out.mutable_shape() = request_tensor.shape();
}

void* PrepareOutput(const v1::Tensor& request_tensor, const ParsedTensor& input,
                    std::vector<double>& scratch, v1::Tensor& out) {
  SetOutputMeta(request_tensor, out);
  if (input.values_form) {
    // Big enough for size elements of either dtype, and double-aligned.
    scratch.resize(input.view.size);
    return scratch.data();
  }
  std::string* bytes = out.mutable_data();
  bytes->resize(input.view.size * ElementSize(input.view.dtype));
  return bytes->data();
}

void CopyValuesOutput(const ParsedTensor& input,
                      const std::vector<double>& scratch, v1::Tensor& out) {
  if (!input.values_form) return;
  auto* values = out.mutable_values();
  if (input.view.dtype == DType::kFloat64) {
    values->Assign(scratch.begin(), scratch.end());
    return;
  }
  values->Reserve(static_cast<int>(input.view.size));
  const DType dtype = input.view.dtype;
  if (IsHalf(dtype)) {
    const auto* halves = reinterpret_cast<const uint16_t*>(scratch.data());
    for (int64_t i = 0; i < input.view.size; ++i) {
      values->Add(HalfToFloat(dtype, halves[i]));
    }
    return;
  }
  const auto* floats = reinterpret_cast<const float*>(scratch.data());
  for (int64_t i = 0; i < input.view.size; ++i) values->Add(floats[i]);
}

namespace {

// Reads protobuf wire format spread over chunks (gRPC slices), by absolute
// byte position. Not thread-safe; one per request.
class WireReader {
 public:
  explicit WireReader(absl::Span<const absl::string_view> chunks)
      : chunks_(chunks) {
    starts_.reserve(chunks.size() + 1);
    for (absl::string_view chunk : chunks) {
      starts_.push_back(size_);
      size_ += static_cast<int64_t>(chunk.size());
    }
    starts_.push_back(size_);
  }

  int64_t size() const { return size_; }
  int64_t pos() const { return pos_; }

  bool ReadVarint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (pos_ >= size_) return false;
      const uint8_t byte = ByteAt(pos_++);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }
  // Skips `bytes`, which must end at or before `limit` (a varint read just
  // before may already have run past it).
  bool Skip(uint64_t bytes, int64_t limit) {
    if (pos_ > limit || bytes > static_cast<uint64_t>(limit - pos_)) {
      return false;
    }
    pos_ += static_cast<int64_t>(bytes);
    return true;
  }
  // Skips the value of a field of wire type `wire_type` (no groups).
  bool SkipValue(uint32_t wire_type, int64_t limit) {
    uint64_t value = 0;
    switch (wire_type) {
      case 0:
        return ReadVarint(value) && pos_ <= limit;
      case 1:
        return Skip(8, limit);
      case 2:
        return ReadVarint(value) && Skip(value, limit);
      case 5:
        return Skip(4, limit);
      default:
        return false;
    }
  }
  template <typename Bytes>
  void AppendRange(int64_t from, int64_t to, Bytes& out) const {
    for (size_t i = ChunkOf(from); from < to; ++i) {
      const int64_t begin = from - starts_[i];
      const int64_t n = std::min<int64_t>(to, starts_[i + 1]) - from;
      out.insert(out.end(), chunks_[i].data() + begin,
                 chunks_[i].data() + begin + n);
      from += n;
    }
  }
  // The bytes [from, from + n) as one view if they lie in one chunk.
  std::optional<absl::string_view> Contiguous(int64_t from, int64_t n) const {
    const size_t i = ChunkOf(from);
    if (from + n > starts_[i + 1]) return std::nullopt;
    return chunks_[i].substr(from - starts_[i], n);
  }
  // Appends the pieces of bytes [from, from + n) to `out`.
  void Chunks(int64_t from, int64_t n, ScatteredBytes& out) const {
    for (size_t i = ChunkOf(from); n > 0; ++i) {
      const int64_t begin = from - starts_[i];
      const int64_t take = std::min<int64_t>(n, starts_[i + 1] - from);
      out.Append(chunks_[i].substr(begin, take));
      from += take;
      n -= take;
    }
  }

 private:
  // The chunk holding byte `pos` (the first non-empty one at or after it).
  size_t ChunkOf(int64_t pos) const {
    return std::upper_bound(starts_.begin(), starts_.end() - 1, pos) -
           starts_.begin() - 1;
  }
  uint8_t ByteAt(int64_t pos) {
    while (pos >= starts_[cursor_ + 1]) ++cursor_;
    return static_cast<uint8_t>(chunks_[cursor_][pos - starts_[cursor_]]);
  }

  absl::Span<const absl::string_view> chunks_;
  absl::InlinedVector<int64_t, 8> starts_;
  int64_t size_ = 0;
  int64_t pos_ = 0;
  size_t cursor_ = 0;  // Chunk of the last byte read (reads move forward).
};

template <typename Bytes>
void AppendVarint(uint64_t value, Bytes& out) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

constexpr uint32_t kLengthDelimited = 2;
constexpr uint32_t kRequestInputField = 3;    // NormalizeRequest.input
constexpr uint32_t kTensorDataField = 3;      // Tensor.data
constexpr uint32_t kResponseOutputField = 1;  // NormalizeResponse.output

char Tag(uint32_t field, uint32_t wire_type) {
  return static_cast<char>(field << 3 | wire_type);
}

// Where input.data lies; nullopt if the wire form is unusual (see
// SplitNormalizeRequest) or malformed. `rest` gets every other byte.
struct DataSpan {
  int64_t offset = 0;
  int64_t size = 0;
};
// Message bytes without the tensor data: small, so usually on the stack.
using WireBytes = absl::InlinedVector<char, 256>;
bool SplitWire(WireReader& reader, WireBytes& rest,
               std::optional<DataSpan>& data) {
  bool seen_input = false;
  while (reader.pos() < reader.size()) {
    const int64_t start = reader.pos();
    uint64_t tag = 0;
    if (!reader.ReadVarint(tag)) return false;
    const uint32_t wire_type = tag & 7;
    if (tag >> 3 != kRequestInputField || wire_type != kLengthDelimited) {
      if (!reader.SkipValue(wire_type, reader.size())) return false;
      reader.AppendRange(start, reader.pos(), rest);
      continue;
    }
    uint64_t length = 0;
    if (seen_input || !reader.ReadVarint(length) ||
        length > static_cast<uint64_t>(reader.size() - reader.pos())) {
      return false;
    }
    seen_input = true;
    const int64_t end = reader.pos() + static_cast<int64_t>(length);
    WireBytes tensor;
    while (reader.pos() < end) {
      const int64_t field_start = reader.pos();
      uint64_t inner = 0;
      if (!reader.ReadVarint(inner)) return false;
      if (inner >> 3 == kTensorDataField && (inner & 7) == kLengthDelimited) {
        uint64_t size = 0;
        if (data.has_value() || !reader.ReadVarint(size)) return false;
        data = DataSpan{reader.pos(), static_cast<int64_t>(size)};
        if (!reader.Skip(size, end)) return false;
        continue;
      }
      if (!reader.SkipValue(inner & 7, end)) return false;
      reader.AppendRange(field_start, reader.pos(), tensor);
    }
    if (reader.pos() != end) return false;
    rest.push_back(Tag(kRequestInputField, kLengthDelimited));
    AppendVarint(tensor.size(), rest);
    rest.insert(rest.end(), tensor.begin(), tensor.end());
  }
  return true;
}

}  // namespace

void GatherInput(ParsedNormalize& parsed, PooledBuffer& gathered) {
  if (parsed.input.view.scattered == nullptr) return;
  const int64_t size = parsed.input.view.scattered->size();
  gathered = AcquirePooled(size);
  parsed.input.view.scattered->CopyOut(0, size, gathered.get());
  parsed.input.view.data = gathered.get();
  parsed.input.view.scattered = nullptr;
  parsed.spec.input = parsed.input.view;
}

absl::Status SplitNormalizeRequest(absl::Span<const absl::string_view> chunks,
                                   SplitRequest& out) {
  WireReader reader(chunks);
  WireBytes rest;
  std::optional<DataSpan> data;
  if (SplitWire(reader, rest, data)) {
    if (!out.message.ParseFromArray(rest.data(),
                                    static_cast<int>(rest.size()))) {
      return absl::InvalidArgumentError(
          "request: not a serialized normd.v1.NormalizeRequest");
    }
    if (data.has_value()) {
      std::optional<absl::string_view> view =
          reader.Contiguous(data->offset, data->size);
      if (view.has_value() &&
          reinterpret_cast<uintptr_t>(view->data()) % sizeof(double) == 0) {
        out.input_data = view;
      } else {
        // Split or misaligned: left where it is (see GatherInput).
        out.scattered.emplace();
        reader.Chunks(data->offset, data->size, *out.scattered);
      }
    }
    return absl::OkStatus();
  }
  // Repeated or malformed fields: let protobuf decide what they mean.
  std::string whole;
  whole.reserve(reader.size());
  reader.AppendRange(0, reader.size(), whole);
  out.message.Clear();
  out.input_data.reset();
  if (!out.message.ParseFromString(whole)) {
    return absl::InvalidArgumentError(
        "request: not a serialized normd.v1.NormalizeRequest");
  }
  return absl::OkStatus();
}

bool SplitTopLevelField(absl::Span<const absl::string_view> chunks,
                        uint32_t field, std::string& rest,
                        std::vector<WireEntry>& entries) {
  WireReader reader(chunks);
  while (reader.pos() < reader.size()) {
    const int64_t start = reader.pos();
    uint64_t tag = 0;
    if (!reader.ReadVarint(tag)) return false;
    if (tag >> 3 != field || (tag & 7) != kLengthDelimited) {
      if (!reader.SkipValue(tag & 7, reader.size())) return false;
      reader.AppendRange(start, reader.pos(), rest);
      continue;
    }
    uint64_t length = 0;
    if (!reader.ReadVarint(length) ||
        length > static_cast<uint64_t>(reader.size() - reader.pos())) {
      return false;
    }
    WireEntry& entry = entries.emplace_back();
    const int64_t size = static_cast<int64_t>(length);
    entry.contiguous = reader.Contiguous(reader.pos(), size);
    reader.Chunks(reader.pos(), size, entry.pieces);
    if (!reader.Skip(length, reader.size())) return false;
  }
  return true;
}

void AppendLengthDelimitedKey(uint32_t field, int64_t length,
                              std::string& out) {
  out.push_back(Tag(field, kLengthDelimited));
  AppendVarint(static_cast<uint64_t>(length), out);
}

ResponseFrame MakeResponseFrame(const v1::Tensor& output, int64_t payload_bytes,
                                const v1::NormalizeResponse& rest) {
  ResponseFrame frame;
  const std::string meta = output.SerializeAsString();
  std::string data_key;
  if (payload_bytes > 0) {
    data_key.push_back(Tag(kTensorDataField, kLengthDelimited));
    AppendVarint(payload_bytes, data_key);
  }
  frame.head.push_back(Tag(kResponseOutputField, kLengthDelimited));
  AppendVarint(meta.size() + data_key.size() + payload_bytes, frame.head);
  frame.head += meta;
  frame.head += data_key;
  frame.tail = rest.SerializeAsString();
  return frame;
}

}  // namespace normd

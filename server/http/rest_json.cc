#include "server/http/rest_json.h"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/half.h"

namespace normd {
namespace {

template <typename Dims>
void AppendShape(const Dims& shape, std::string& out) {
  out.push_back('[');
  bool first = true;
  for (const int64_t dim : shape) {
    if (!first) out.push_back(',');
    first = false;
    absl::StrAppend(&out, dim);
  }
  out.push_back(']');
}

// The most bytes the shortest round-trip decimal of a T takes
// ("-2.2250738585072014e-308", "-1.17549435e-38").
template <typename T>
constexpr size_t kMaxNumberBytes = sizeof(T) == 8 ? 24 : 15;

// The shortest decimal that reads back as each element of `bytes` (count
// floats or doubles), comma-separated, written at `out`, which has room for
// kMaxNumberBytes<T> + 1 per element; NaN and the infinities as Python's
// json writes them (JSON has no such numbers). Returns the end.
template <typename T>
char* WriteNumbers(const char* bytes, size_t count, char* out) {
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) *out++ = ',';
    T v;
    std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
    if (!std::isfinite(v)) {
      const absl::string_view text = std::isnan(v) ? "NaN"
                                     : v > 0       ? "Infinity"
                                                   : "-Infinity";
      std::memcpy(out, text.data(), text.size());
      out += text.size();
      continue;
    }
    out = std::to_chars(out, out + kMaxNumberBytes<T>, v).ptr;
  }
  return out;
}

// Raw little-endian elements of `dtype` as a flat JSON array, written in
// place (no append per number).
void AppendJsonData(DType dtype, absl::string_view bytes, std::string& out) {
  const size_t size = static_cast<size_t>(ElementSize(dtype));
  const size_t count = bytes.size() / size;
  const size_t at = out.size();
  out.resize(at + 2 +
             count * (dtype == DType::kFloat64 ? kMaxNumberBytes<double> + 1
                                               : kMaxNumberBytes<float> + 1));
  char* p = out.data() + at;
  *p++ = '[';
  if (dtype == DType::kFloat64) {
    p = WriteNumbers<double>(bytes.data(), count, p);
  } else if (dtype == DType::kFloat32) {
    p = WriteNumbers<float>(bytes.data(), count, p);
  } else {
    // 16-bit values, widened exactly to fp32 a block at a time.
    constexpr size_t kBlock = 256;
    float widened[kBlock];
    for (size_t i = 0; i < count; i += kBlock) {
      const size_t n = std::min(kBlock, count - i);
      for (size_t j = 0; j < n; ++j) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + (i + j) * 2, sizeof(h));
        widened[j] = HalfToFloat(dtype, h);
      }
      if (i > 0) *p++ = ',';
      p = WriteNumbers<float>(reinterpret_cast<const char*>(widened), n, p);
    }
  }
  *p++ = ']';
  out.resize(static_cast<size_t>(p - out.data()));
}

// {"name":..., "datatype":..., "shape":[...]} without its closing brace.
void AppendTensorHead(absl::string_view name, absl::string_view datatype,
                      const std::vector<int64_t>& shape, std::string& out) {
  out.append("{\"name\":");
  AppendJsonString(name, out);
  out.append(",\"datatype\":");
  AppendJsonString(datatype, out);
  out.append(",\"shape\":");
  AppendShape(shape, out);
}

}  // namespace

void AppendJsonString(absl::string_view text, std::string& out) {
  // JSON text is Unicode: a string that is not valid UTF-8 (a client's
  // bytes echoed back, such as a model name from a path) has each of its
  // non-ASCII bytes written as U+FFFD, the replacement character.
  const bool utf8 = simdjson::validate_utf8(text.data(), text.size());
  out.push_back('"');
  for (const char c : text) {
    if (!utf8 && static_cast<unsigned char>(c) >= 0x80) {
      out.append("\\ufffd");
      continue;
    }
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

int64_t JsonOutputBytes(DType dtype, int64_t elements) {
  // The longest shortest-round-trip forms and a comma.
  return elements * static_cast<int64_t>(dtype == DType::kFloat64
                                             ? kMaxNumberBytes<double> + 1
                                             : kMaxNumberBytes<float> + 1) +
         2;
}

std::string FormatInferReply(absl::string_view model, absl::string_view id,
                             const InferReply& reply, absl::string_view output,
                             bool binary_output) {
  std::string out;
  if (reply.output.has_output && !binary_output) {
    out.reserve(static_cast<size_t>(
        JsonOutputBytes(reply.output.dtype, reply.output.elements) + 256));
  }
  out.append("{\"model_name\":");
  AppendJsonString(model, out);
  out.append(",\"model_version\":\"1\"");
  if (!id.empty()) {
    out.append(",\"id\":");
    AppendJsonString(id, out);
  }
  if (reply.counters.has_value()) {
    // Unsigned numbers stay unsigned: generation is a uint64.
    absl::StrAppend(
        &out, ",\"parameters\":{\"generation\":", reply.counters->generation,
        ",\"num_batches_tracked\":", reply.counters->num_batches_tracked, "}");
  }
  out.append(",\"outputs\":[");
  if (reply.output.has_output) {
    AppendTensorHead("output", reply.output.datatype, reply.output.shape, out);
    if (binary_output) {
      absl::StrAppend(
          &out, ",\"parameters\":{\"binary_data_size\":", output.size(), "}}");
    } else {
      out.append(",\"data\":");
      AppendJsonData(reply.output.dtype, output, out);
      out.push_back('}');
    }
  }
  out.append("]}");
  return out;
}

std::string ServerMetadataJson(const OipServerMetadata& metadata) {
  std::string out = "{\"name\":";
  AppendJsonString(metadata.name, out);
  out.append(",\"version\":");
  AppendJsonString(metadata.version, out);
  out.append(",\"extensions\":[");
  for (size_t i = 0; i < metadata.extensions.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(metadata.extensions[i], out);
  }
  out.append("]}");
  return out;
}

std::string ModelMetadataJson(const OipModelMetadata& metadata) {
  std::string out = "{\"name\":";
  AppendJsonString(metadata.name, out);
  out.append(",\"versions\":[");
  for (size_t i = 0; i < metadata.versions.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(metadata.versions[i], out);
  }
  out.append("],\"platform\":");
  AppendJsonString(metadata.platform, out);
  auto tensors = [&out](const char* key,
                        const std::vector<OipTensorMetadata>& list) {
    absl::StrAppend(&out, ",\"", key, "\":[");
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out.push_back(',');
      AppendTensorHead(list[i].name, list[i].datatype, list[i].shape, out);
      out.push_back('}');
    }
    out.push_back(']');
  };
  tensors("inputs", metadata.inputs);
  tensors("outputs", metadata.outputs);
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

std::string RepositoryIndexJson(const std::vector<OipRepositoryEntry>& index) {
  std::string out = "[";
  for (size_t i = 0; i < index.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append("{\"name\":");
    AppendJsonString(index[i].name, out);
    out.append(",\"version\":");
    AppendJsonString(index[i].version, out);
    out.append(",\"state\":");
    AppendJsonString(index[i].state, out);
    out.push_back('}');
  }
  out.push_back(']');
  return out;
}

std::string ModelConfigJson(const OipModelConfig& config) {
  std::string out = "{\"name\":";
  AppendJsonString(config.name, out);
  out.append(",\"platform\":");
  AppendJsonString(config.platform, out);
  out.append(",\"max_batch_size\":0");
  auto tensors = [&out](const char* key,
                        const std::vector<OipTensorMetadata>& list) {
    absl::StrAppend(&out, ",\"", key, "\":[");
    for (size_t i = 0; i < list.size(); ++i) {
      if (i > 0) out.push_back(',');
      out.append("{\"name\":");
      AppendJsonString(list[i].name, out);
      out.append(",\"data_type\":");
      AppendJsonString(absl::StrCat("TYPE_", list[i].datatype), out);
      out.append(",\"dims\":");
      AppendShape(list[i].shape, out);
      out.push_back('}');
    }
    out.push_back(']');
  };
  tensors("input", config.inputs);
  tensors("output", config.outputs);
  out.append(",\"parameters\":{");
  for (size_t i = 0; i < config.parameters.size(); ++i) {
    if (i > 0) out.push_back(',');
    AppendJsonString(config.parameters[i].first, out);
    out.append(":{\"string_value\":");
    AppendJsonString(config.parameters[i].second, out);
    out.push_back('}');
  }
  out.append("}}");
  return out;
}

// ,"drift":{...}: the DriftReport's summary, its measures only when present.
void AppendDriftJson(const DriftReport& drift, std::string& out) {
  out.append(",\"drift\":{\"reference_source\":");
  AppendJsonString(ReferenceSourceName(drift.reference_source), out);
  absl::StrAppend(
      &out, ",\"reference_set_unix_nanos\":", drift.reference_set_unix_nanos,
      ",\"window_samples\":", drift.window_samples,
      ",\"window_seconds\":", drift.window_seconds);
  if (drift.measures.has_value()) {
    const DriftMeasures& m = *drift.measures;
    const double values[] = {m.kl_max, m.kl_mean, m.shift_max};
    const char* names[] = {"kl_max", "kl_mean", "shift_max"};
    for (int i = 0; i < 3; ++i) {
      absl::StrAppend(&out, ",\"", names[i], "\":");
      char number[kMaxNumberBytes<double> + 1];
      out.append(number,
                 WriteNumbers<double>(reinterpret_cast<const char*>(&values[i]),
                                      1, number));
    }
    absl::StrAppend(&out, ",\"channels_drifted\":", m.channels_drifted);
  }
  out.push_back('}');
}

std::string ModelStatisticsJson(const std::vector<OipModelStatistics>& stats) {
  std::string out = "{\"model_stats\":[";
  for (size_t i = 0; i < stats.size(); ++i) {
    const InferStatistics& s = stats[i].infer;
    if (i > 0) out.push_back(',');
    out.append("{\"name\":");
    AppendJsonString(stats[i].name, out);
    out.append(",\"version\":");
    AppendJsonString(stats[i].version, out);
    absl::StrAppend(
        &out, ",\"last_inference\":", s.last_inference_ms,
        ",\"inference_count\":", s.success_count,
        ",\"execution_count\":", s.success_count,
        ",\"inference_stats\":{\"success\":{\"count\":", s.success_count,
        ",\"ns\":", s.success_ns, "},\"fail\":{\"count\":", s.fail_count,
        ",\"ns\":", s.fail_ns, "}}");
    if (stats[i].drift.has_value()) AppendDriftJson(*stats[i].drift, out);
    out.push_back('}');
  }
  out.append("]}");
  return out;
}

std::string ErrorJson(absl::string_view message) {
  std::string out = "{\"error\":";
  AppendJsonString(message, out);
  out.push_back('}');
  return out;
}

}  // namespace normd

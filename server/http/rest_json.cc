#include "server/http/rest_json.h"

#include <simdjson.h>

#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/half.h"

namespace normd {
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

// Raw little-endian elements of `dtype` as a flat JSON array.
void AppendJsonData(DType dtype, absl::string_view bytes, std::string& out) {
  const size_t size = static_cast<size_t>(ElementSize(dtype));
  const size_t count = bytes.size() / size;
  out.push_back('[');
  for (size_t i = 0; i < count; ++i) {
    if (i > 0) out.push_back(',');
    const char* p = bytes.data() + i * size;
    if (dtype == DType::kFloat64) {
      double v;
      std::memcpy(&v, p, sizeof(v));
      AppendJsonNumber(v, out);
    } else if (dtype == DType::kFloat32) {
      float v;
      std::memcpy(&v, p, sizeof(v));
      AppendJsonNumber(v, out);
    } else {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      AppendJsonNumber(HalfToFloat(dtype, h), out);
    }
  }
  out.push_back(']');
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
  // The longest shortest-round-trip forms ("-2.2250738585072014e-308",
  // "-1.17549435e-38") and a comma.
  return elements * (dtype == DType::kFloat64 ? 25 : 16) + 2;
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
        ",\"ns\":", s.fail_ns, "}}}");
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

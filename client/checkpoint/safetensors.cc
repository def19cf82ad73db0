#include "client/checkpoint/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/checkpoint/layer_values.h"
#include "simdjson.h"

namespace normd::client {
namespace {

namespace dom = simdjson::dom;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

void AppendJsonString(std::string& out, absl::string_view text) {
  out += '"';
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(
          &out, "\\u00",
          absl::Hex(static_cast<unsigned char>(c), absl::kZeroPad2));
    } else {
      out += c;
    }
  }
  out += '"';
}

// The byte count of `shape` of `element_bytes` elements; nullopt when it
// would not fit an int64.
std::optional<int64_t> ShapeBytes(const std::vector<int64_t>& shape,
                                  int64_t element_bytes) {
  int64_t bytes = element_bytes;
  for (int64_t dim : shape) {
    if (dim != 0 && bytes > kInt64Max / dim) return std::nullopt;
    bytes *= dim;
  }
  return bytes;
}

// A tensor's [begin, end) in the data section.
struct Offsets {
  uint64_t begin = 0;
  uint64_t end = 0;
};

}  // namespace

int64_t SafetensorsElementBytes(absl::string_view dtype) {
  static constexpr std::pair<const char*, int64_t> kDtypes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2},  {"BF16", 2},    {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U64", 8},     {"U32", 4},
      {"U16", 2}, {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kDtypes) {
    if (dtype == name) return bytes;
  }
  return 0;
}

absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(
    absl::string_view file, absl::string_view file_name,
    uint64_t max_header_bytes) {
  const auto fail = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(file_name, ": ", parts...));
  };
  if (file.size() < 8) {
    return fail("not a safetensors file: ", file.size(),
                " bytes, fewer than the 8 of its header length");
  }
  const uint64_t header_bytes = LoadLittleEndian<uint64_t>(file.data());
  if (header_bytes > max_header_bytes) {
    return fail("the header length ", header_bytes, " is over the limit of ",
                max_header_bytes, " bytes (--max_header_bytes)");
  }
  if (header_bytes > file.size() - 8) {
    return fail("the header length ", header_bytes,
                " runs past the end of the file (", file.size(),
                " bytes): the file is truncated or not a safetensors file");
  }
  const absl::string_view header = file.substr(8, header_bytes);
  const absl::string_view data = file.substr(8 + header_bytes);
  if (header.empty() || header.front() != '{') {
    return fail("the header is not a JSON object");
  }
  const simdjson::padded_string padded(header.data(), header.size());
  dom::parser parser;
  dom::element root;
  if (const simdjson::error_code error = parser.parse(padded).get(root);
      error != simdjson::SUCCESS) {
    return fail("the header is not valid JSON (",
                simdjson::error_message(error), ")");
  }
  dom::object tensors;
  if (root.get_object().get(tensors) != simdjson::SUCCESS) {
    return fail("the header is not a JSON object");
  }
  std::vector<SafetensorsTensor> out;
  std::vector<Offsets> offsets;
  absl::flat_hash_set<std::string> names;
  bool seen_metadata = false;
  for (const dom::key_value_pair field : tensors) {
    const std::string name(field.key);
    if (name == "__metadata__") {
      // A default dom::object has no document: iterate it only once read.
      dom::object metadata;
      bool strings = !seen_metadata && field.value.get_object().get(metadata) ==
                                           simdjson::SUCCESS;
      if (strings) {
        for (auto entry : metadata)
          strings = strings && entry.value.is_string();
      }
      if (!strings) {
        return fail("__metadata__ is not one object of strings");
      }
      seen_metadata = true;
      continue;
    }
    const auto bad = [&](auto&&... parts) {
      return fail("tensor '", name, "': ", parts...);
    };
    if (!names.insert(name).second) {
      return bad("named twice in the header");
    }
    dom::object entry;
    if (field.value.get_object().get(entry) != simdjson::SUCCESS) {
      return bad("its entry is not a JSON object");
    }
    SafetensorsTensor tensor;
    tensor.name = name;
    std::string_view dtype;
    if (entry["dtype"].get_string().get(dtype) != simdjson::SUCCESS) {
      return bad("no \"dtype\" string");
    }
    tensor.dtype = std::string(dtype);
    const int64_t element_bytes = SafetensorsElementBytes(tensor.dtype);
    if (element_bytes == 0) {
      return bad("unknown dtype '", tensor.dtype, "'");
    }
    dom::array shape;
    if (entry["shape"].get_array().get(shape) != simdjson::SUCCESS) {
      return bad("no \"shape\" array");
    }
    for (dom::element dim : shape) {
      uint64_t value;
      if (dim.get_uint64().get(value) != simdjson::SUCCESS ||
          value > static_cast<uint64_t>(kInt64Max)) {
        return bad("\"shape\" holds something other than a dimension >= 0");
      }
      tensor.shape.push_back(static_cast<int64_t>(value));
    }
    dom::array range;
    Offsets at;
    if (entry["data_offsets"].get_array().get(range) != simdjson::SUCCESS ||
        range.size() != 2 ||
        range.at(0).get_uint64().get(at.begin) != simdjson::SUCCESS ||
        range.at(1).get_uint64().get(at.end) != simdjson::SUCCESS) {
      return bad("\"data_offsets\" is not [begin, end] of two integers >= 0");
    }
    if (at.begin > at.end || at.end > data.size()) {
      return bad("data_offsets [", at.begin, ", ", at.end,
                 ") are not inside the file's ", data.size(),
                 " bytes of data: the file is truncated or corrupt");
    }
    const std::optional<int64_t> bytes =
        ShapeBytes(tensor.shape, element_bytes);
    if (!bytes.has_value() ||
        static_cast<uint64_t>(*bytes) != at.end - at.begin) {
      return bad("data_offsets [", at.begin, ", ", at.end, ") hold ",
                 at.end - at.begin, " bytes, but ", tensor.dtype, " of shape ",
                 ShapeText(tensor.shape), " takes ",
                 bytes.has_value() ? absl::StrCat(*bytes) : "too many");
    }
    tensor.data = data.substr(at.begin, at.end - at.begin);
    out.push_back(std::move(tensor));
    offsets.push_back(at);
  }
  // The tensors must tile the data: sorted by offset, each starts where the
  // one before ends, and the last ends with the file.
  std::vector<size_t> order(out.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::pair(offsets[a].begin, offsets[a].end) <
           std::pair(offsets[b].begin, offsets[b].end);
  });
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (size_t i : order) {
    if (offsets[i].begin < covered) {
      return fail("tensor '", out[i].name, "' overlaps tensor '",
                  previous->name, "' (data_offsets start at ", offsets[i].begin,
                  ", before ", covered, ")");
    }
    if (offsets[i].begin > covered) {
      return fail("the ", offsets[i].begin - covered, " bytes at ", covered,
                  " of the data belong to no tensor (before tensor '",
                  out[i].name, "')");
    }
    covered = offsets[i].end;
    previous = &out[i];
  }
  if (covered != data.size()) {
    return fail("the last ", data.size() - covered,
                " bytes of the data belong to no tensor");
  }
  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(out.size());
  for (size_t i : order) sorted.push_back(std::move(out[i]));
  return sorted;
}

absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<SafetensorsOutput>& tensors) {
  std::string header = "{";
  uint64_t offset = 0;
  absl::flat_hash_set<absl::string_view> names;
  for (const SafetensorsOutput& tensor : tensors) {
    const int64_t element_bytes = SafetensorsElementBytes(tensor.dtype);
    const std::optional<int64_t> bytes =
        element_bytes == 0 ? std::nullopt
                           : ShapeBytes(tensor.shape, element_bytes);
    if (!bytes.has_value() ||
        static_cast<uint64_t>(*bytes) != tensor.data.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor.name, "': ", tensor.data.size(),
                       " bytes do not make ", tensor.dtype, " of shape ",
                       ShapeText(tensor.shape)));
    }
    if (!names.insert(tensor.name).second || tensor.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor.name, "': named twice or reserved"));
    }
    if (header.size() > 1) header += ',';
    AppendJsonString(header, tensor.name);
    absl::StrAppend(&header, ":{\"dtype\":\"", tensor.dtype, "\",\"shape\":[",
                    absl::StrJoin(tensor.shape, ","), "],\"data_offsets\":[",
                    offset, ",", offset + tensor.data.size(), "]}");
    offset += tensor.data.size();
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file;
  file.reserve(8 + header.size() + offset);
  for (int i = 0; i < 8; ++i) {
    file += static_cast<char>((uint64_t{header.size()} >> (8 * i)) & 0xff);
  }
  file += header;
  for (const SafetensorsOutput& tensor : tensors) file += tensor.data;
  return file;
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes) {
  const std::filesystem::path target(path);
  const std::string temporary =
      absl::StrCat(path, ".tmp-", static_cast<int64_t>(getpid()));
  const auto failed = [&](absl::string_view what) {
    const int error = errno;
    unlink(temporary.c_str());
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot ", what, " (", std::strerror(error), ")"));
  };
  const int fd =
      open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed("create a temporary file beside it");
  while (!bytes.empty()) {
    const ssize_t written = write(fd, bytes.data(), bytes.size());
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      close(fd);
      return failed("write it");
    }
    bytes.remove_prefix(static_cast<size_t>(written));
  }
  if (fsync(fd) != 0) {
    close(fd);
    return failed("flush it to disk");
  }
  if (close(fd) != 0) return failed("close it");
  if (rename(temporary.c_str(), path.c_str()) != 0) {
    return failed("rename the temporary file over it");
  }
  // The rename itself is durable once the directory is synced.
  const std::string directory =
      target.has_parent_path() ? target.parent_path().string() : ".";
  if (const int dir_fd = open(directory.c_str(), O_RDONLY | O_CLOEXEC);
      dir_fd >= 0) {
    fsync(dir_fd);
    close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace normd::client

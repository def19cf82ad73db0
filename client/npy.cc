#include "client/npy.h"

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/tensor_io.h"

namespace normd::client {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);

absl::Status Bad(absl::string_view path, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", what));
}

// The value after 'key': in the header dict, up to the next top-level ','.
absl::StatusOr<absl::string_view> DictValue(absl::string_view dict,
                                            absl::string_view key,
                                            absl::string_view path) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t at = dict.find(quoted);
  if (at == absl::string_view::npos) {
    return Bad(path, absl::StrCat("the .npy header has no ", quoted));
  }
  at = dict.find(':', at + quoted.size());
  if (at == absl::string_view::npos) return Bad(path, "bad .npy header");
  absl::string_view rest = dict.substr(at + 1);
  size_t end = 0;
  int depth = 0;
  for (; end < rest.size(); ++end) {
    const char c = rest[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' && depth == 0) || c == '}') break;
  }
  return absl::StripAsciiWhitespace(rest.substr(0, end));
}

int64_t Product(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         absl::string_view path) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != kMagic) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const int major = static_cast<unsigned char>(bytes[6]);
  size_t length_bytes = major == 1 ? 2 : 4;
  if (major < 1 || major > 3) {
    return Bad(path, absl::StrCat(".npy format version ", major,
                                  " is not supported (1, 2 or 3)"));
  }
  if (bytes.size() < 8 + length_bytes) return Bad(path, "truncated header");
  size_t header_length = 0;
  for (size_t i = 0; i < length_bytes; ++i) {
    header_length |=
        static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i]))
        << (8 * i);
  }
  const size_t start = 8 + length_bytes;
  if (bytes.size() < start + header_length) {
    return Bad(path, "truncated header");
  }
  const absl::string_view dict = bytes.substr(start, header_length);
  NpyHeader header;
  header.data_offset = static_cast<int64_t>(start + header_length);

  absl::StatusOr<absl::string_view> descr = DictValue(dict, "descr", path);
  if (!descr.ok()) return descr.status();
  const absl::string_view d =
      absl::StripSuffix(absl::StripPrefix(*descr, "'"), "'");
  if (d == "<f4") {
    header.dtype = v1::FLOAT32;
    header.element_bytes = 4;
  } else if (d == "<f8") {
    header.dtype = v1::FLOAT64;
    header.element_bytes = 8;
  } else if (d == "<f2") {
    header.dtype = v1::FLOAT16;
    header.element_bytes = 2;
  } else {
    return Bad(path, absl::StrCat("element type ", d,
                                  " is not supported: save little-endian "
                                  "float32/float64/float16 (e.g. "
                                  "x.astype('<f4'))"));
  }
  absl::StatusOr<absl::string_view> fortran =
      DictValue(dict, "fortran_order", path);
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return Bad(path,
               "Fortran-ordered array: save np.ascontiguousarray(x) instead");
  }
  absl::StatusOr<absl::string_view> shape = DictValue(dict, "shape", path);
  if (!shape.ok()) return shape.status();
  absl::string_view dims =
      absl::StripSuffix(absl::StripPrefix(*shape, "("), ")");
  // The product of the nonzero dimensions is bounded, not the product of
  // all of them: an empty array (a dimension 0) must not hide others whose
  // product overflows (a reader multiplies the trailing dimensions into a
  // row's size).
  int64_t nonzero_product = 1;
  for (absl::string_view dim :
       absl::StrSplit(dims, ',', absl::SkipWhitespace())) {
    int64_t n;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(dim), &n) || n < 0) {
      return Bad(path, absl::StrCat("bad shape ", *shape));
    }
    if (n > 0) {
      if (nonzero_product > std::numeric_limits<int64_t>::max() / 8 / n) {
        return Bad(path, absl::StrCat("shape ", *shape, " is too large"));
      }
      nonzero_product *= n;
    }
    header.shape.push_back(n);
  }
  return header;
}

absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(*bytes, path);
  if (!header.ok()) return header.status();
  const int64_t expected = Product(header->shape) * header->element_bytes;
  const int64_t present =
      static_cast<int64_t>(bytes->size()) - header->data_offset;
  if (present != expected) {
    return Bad(path, absl::StrCat("holds ", present,
                                  " bytes of elements, its "
                                  "shape needs ",
                                  expected));
  }
  v1::Tensor tensor;
  tensor.set_dtype(header->dtype);
  tensor.mutable_shape()->Assign(header->shape.begin(), header->shape.end());
  if (expected > 0) tensor.set_data(bytes->substr(header->data_offset));
  return tensor;
}

absl::StatusOr<std::string> EncodeNpy(const v1::Tensor& tensor) {
  const v1::DataType dtype = tensor.dtype() == v1::DATA_TYPE_UNSPECIFIED
                                 ? v1::FLOAT32
                                 : tensor.dtype();
  const char* descr = dtype == v1::FLOAT64   ? "<f8"
                      : dtype == v1::FLOAT32 ? "<f4"
                      : dtype == v1::FLOAT16 ? "<f2"
                                             : nullptr;
  if (descr == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "output: ", v1::DataType_Name(dtype), " has no .npy element type"));
  }
  std::string data = tensor.data();
  if (tensor.values_size() > 0) {  // The values form: encode it.
    std::vector<double> values(tensor.values().begin(), tensor.values().end());
    std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    data = MakeTensor(shape, values, dtype).data();
  }
  std::string shape = absl::StrJoin(tensor.shape(), ", ");
  if (tensor.shape_size() == 1) shape += ",";
  std::string dict =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", shape, "), }");
  // Pad with spaces so that the data starts at a multiple of 64; end in \n.
  const bool v2 = dict.size() + 1 + 10 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) {
    out += static_cast<char>((dict.size() >> (8 * i)) & 0xff);
  }
  out += dict;
  out += data;
  return out;
}

absl::Status WriteNpy(const std::string& path, const v1::Tensor& tensor) {
  absl::StatusOr<std::string> bytes = EncodeNpy(tensor);
  if (!bytes.ok()) return bytes.status();
  return WriteFile(path, *bytes);
}

NpyReader::NpyReader(std::string path, NpyHeader header, std::ifstream in)
    : path_(std::move(path)), header_(std::move(header)), in_(std::move(in)) {
  row_bytes_ = header_.element_bytes;
  for (size_t i = 1; i < header_.shape.size(); ++i) {
    row_bytes_ *= header_.shape[i];
  }
  rows_left_ = header_.shape.empty() ? 0 : header_.shape[0];
}

absl::StatusOr<std::unique_ptr<NpyReader>> NpyReader::Open(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(path, ": cannot open (", std::strerror(errno), ")"));
  }
  std::string start(12, '\0');
  in.read(start.data(), 12);
  start.resize(static_cast<size_t>(in.gcount()));
  if (start.size() < 10 || start.substr(0, 6) != kMagic) {
    return Bad(path, "not a .npy file (no \\x93NUMPY magic)");
  }
  const bool v1_header = start[6] == 1;
  size_t length = static_cast<unsigned char>(start[8]) |
                  static_cast<size_t>(static_cast<unsigned char>(start[9]))
                      << 8;
  if (!v1_header && start.size() == 12) {
    length |= static_cast<size_t>(static_cast<unsigned char>(start[10])) << 16 |
              static_cast<size_t>(static_cast<unsigned char>(start[11])) << 24;
  }
  const size_t total = (v1_header ? 10 : 12) + length;
  // The header length comes from the file: read no more than the file has
  // (a 4 GiB length in a small file must not allocate 4 GiB). clear():
  // a file shorter than `start` left the stream failed.
  in.clear();
  in.seekg(0, std::ios::end);
  const int64_t file_size = static_cast<int64_t>(in.tellg());
  if (static_cast<int64_t>(total) > file_size) {
    return Bad(path, "truncated header");
  }
  std::string head(total, '\0');
  in.seekg(0);
  in.read(head.data(), static_cast<std::streamsize>(total));
  head.resize(static_cast<size_t>(in.gcount()));
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(head, path);
  if (!header.ok()) return header.status();
  if (header->shape.empty()) {
    return Bad(path, "a 0-d array has no rows to stream");
  }
  // The file must hold exactly what the shape says.
  const int64_t expected = Product(header->shape) * header->element_bytes;
  if (file_size - header->data_offset != expected) {
    return Bad(path,
               absl::StrCat("holds ", file_size - header->data_offset,
                            " bytes of elements, its shape needs ", expected));
  }
  in.seekg(header->data_offset);
  return std::unique_ptr<NpyReader>(
      new NpyReader(path, *std::move(header), std::move(in)));
}

absl::StatusOr<v1::Tensor> NpyReader::ReadRows(int64_t rows) {
  const int64_t n = std::min(rows, rows_left_);
  v1::Tensor tensor;
  tensor.set_dtype(header_.dtype);
  tensor.add_shape(n);
  for (size_t i = 1; i < header_.shape.size(); ++i) {
    tensor.add_shape(header_.shape[i]);
  }
  std::string* data = tensor.mutable_data();
  data->resize(static_cast<size_t>(n * row_bytes_));
  in_.read(data->data(), static_cast<std::streamsize>(data->size()));
  if (in_.gcount() != static_cast<std::streamsize>(data->size())) {
    return absl::DataLossError(absl::StrCat(path_, ": read failed"));
  }
  rows_left_ -= n;
  return tensor;
}

}  // namespace normd::client

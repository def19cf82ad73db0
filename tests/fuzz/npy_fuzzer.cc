// libFuzzer target over normctl's .npy reading (client/npy.h): the bytes
// are parsed as a header, and written to a file that ReadNpy and NpyReader
// read. Each must answer with a status, never crash, hang or over-allocate,
// and what they accept must be self-consistent: the header's data offset
// lies within the bytes, a whole-file read holds exactly what the shape
// says, streaming yields the rows of shape[0], and a header that parses
// re-encodes (EncodeNpy) to one that parses to the same dtype and shape.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "client/npy.h"

namespace {

// Aborts (a finding) when a property fails.
void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "npy_fuzzer: %s\n", what);
    std::abort();
  }
}

// Elements of `shape`, or -1 past kMaxElements.
int64_t Elements(const std::vector<int64_t>& shape) {
  constexpr int64_t kMaxElements = 1 << 16;
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return 0;
  }
  for (int64_t d : shape) {
    if (d > kMaxElements / n) return -1;
    n *= d;
  }
  return n;
}

void CheckHeader(absl::string_view bytes) {
  const absl::StatusOr<normd::client::NpyHeader> header =
      normd::client::ParseNpyHeader(bytes, "fuzz.npy");
  if (!header.ok()) {
    Check(header.status().code() == absl::StatusCode::kInvalidArgument,
          "a bad header is not INVALID_ARGUMENT");
    return;
  }
  Check(header->data_offset >= 10 &&
            header->data_offset <= static_cast<int64_t>(bytes.size()),
        "data offset outside the bytes");
  // The size the shape says must be representable (the parser bounds it).
  int64_t bytes_needed = header->element_bytes;
  for (int64_t d : header->shape) {
    Check(d >= 0, "negative dimension");
    if (d != 0) {
      Check(bytes_needed <= std::numeric_limits<int64_t>::max() / d,
            "shape overflows int64");
    }
    bytes_needed *= d;
  }
  const int64_t elements = Elements(header->shape);
  if (elements < 0) return;  // Too big to re-encode here.
  normd::v1::Tensor tensor;
  tensor.set_dtype(header->dtype);
  tensor.mutable_shape()->Assign(header->shape.begin(), header->shape.end());
  tensor.set_data(std::string(elements * header->element_bytes, '\0'));
  const absl::StatusOr<std::string> encoded = normd::client::EncodeNpy(tensor);
  Check(encoded.ok(), "EncodeNpy refused a parsed header's tensor");
  const absl::StatusOr<normd::client::NpyHeader> again =
      normd::client::ParseNpyHeader(*encoded, "again.npy");
  Check(again.ok(), "EncodeNpy's header does not parse");
  Check(again->dtype == header->dtype && again->shape == header->shape,
        "EncodeNpy's header differs");
}

void CheckFile(const uint8_t* data, size_t size) {
  static const std::string path =
      (std::filesystem::temp_directory_path() /
       ("normd_npy_fuzz_" + std::to_string(getpid()) + ".npy"))
          .string();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data),
              static_cast<std::streamsize>(size));
  }
  const absl::StatusOr<normd::v1::Tensor> whole = normd::client::ReadNpy(path);
  if (whole.ok()) {
    const absl::StatusOr<normd::client::NpyHeader> header =
        normd::client::ParseNpyHeader(
            absl::string_view(reinterpret_cast<const char*>(data), size),
            "fuzz.npy");
    Check(header.ok(), "ReadNpy accepted what ParseNpyHeader refuses");
    Check(static_cast<int64_t>(whole->data().size()) ==
              static_cast<int64_t>(size) - header->data_offset,
          "ReadNpy's data is not the rest of the file");
  }
  absl::StatusOr<std::unique_ptr<normd::client::NpyReader>> reader =
      normd::client::NpyReader::Open(path);
  if (!reader.ok()) return;
  Check(whole.ok(), "NpyReader opened what ReadNpy refuses");
  const int64_t rows = (*reader)->header().shape[0];
  int64_t read = 0;
  // Rows in pieces of 3; a file this small cannot hold many rows unless
  // they are empty, so cap the calls.
  for (int calls = 0; (*reader)->rows_left() > 0 && calls < 4096; ++calls) {
    const absl::StatusOr<normd::v1::Tensor> piece = (*reader)->ReadRows(3);
    Check(piece.ok(), "ReadRows failed on a file Open checked");
    Check(static_cast<int64_t>(piece->data().size()) ==
              piece->shape(0) * (*reader)->row_bytes(),
          "a piece's data does not match its rows");
    read += piece->shape(0);
  }
  Check((*reader)->rows_left() > 0 || read == rows,
        "streamed rows do not add up to shape[0]");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckHeader(absl::string_view(reinterpret_cast<const char*>(data), size));
  CheckFile(data, size);
  return 0;
}

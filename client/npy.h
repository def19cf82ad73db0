// NumPy .npy files (format versions 1.0, 2.0 and 3.0) as normd tensors:
// little-endian float32 / float64 / float16, C order. Reading whole files,
// streaming a file's leading-dimension slices, and writing. Stateless
// functions are thread-safe; an NpyReader is used by one thread at a time.
#ifndef NORMD_CLIENT_NPY_H_
#define NORMD_CLIENT_NPY_H_

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "normd/v1/normalizer.pb.h"

namespace normd::client {

// What a .npy header says.
struct NpyHeader {
  v1::DataType dtype = v1::FLOAT32;
  int64_t element_bytes = 4;
  std::vector<int64_t> shape;
  int64_t data_offset = 0;  // Where the elements start in the file.
};

// Parses the header at the start of `bytes` (the file's first bytes; at
// least the whole header). INVALID_ARGUMENT naming `path` and what is wrong:
// not a .npy file, big-endian or non-float elements, Fortran order.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         absl::string_view path);

// A whole .npy file as a tensor (its `data` form); INVALID_ARGUMENT if the
// file is shorter or longer than its shape says.
absl::StatusOr<v1::Tensor> ReadNpy(const std::string& path);

// The .npy bytes (format 1.0, or 2.0 for huge headers) of a FLOAT32,
// FLOAT64 or FLOAT16 tensor in either form.
absl::StatusOr<std::string> EncodeNpy(const v1::Tensor& tensor);
absl::Status WriteNpy(const std::string& path, const v1::Tensor& tensor);

// Reads a .npy file in slices along its first dimension (rows), for
// streaming files larger than one message.
class NpyReader {
 public:
  static absl::StatusOr<std::unique_ptr<NpyReader>> Open(
      const std::string& path);

  const NpyHeader& header() const { return header_; }
  int64_t rows_left() const { return rows_left_; }
  int64_t row_bytes() const { return row_bytes_; }
  // The next min(rows, rows_left()) rows as a tensor of shape
  // [n, shape[1:]...].
  absl::StatusOr<v1::Tensor> ReadRows(int64_t rows);

 private:
  NpyReader(std::string path, NpyHeader header, std::ifstream in);

  std::string path_;
  NpyHeader header_;
  std::ifstream in_;
  int64_t row_bytes_ = 0;
  int64_t rows_left_ = 0;
};

}  // namespace normd::client

#endif  // NORMD_CLIENT_NPY_H_

// safetensors files (Hugging Face's format, what PyTorch state_dicts travel
// in): an 8-byte little-endian header length N, N bytes of JSON naming each
// tensor's dtype, shape and [begin, end) offsets into the data that follows,
// then the data. Read from a view of the whole file (a mapping: nothing is
// copied but the header), checked as the reference implementation checks it
// and more; written atomically. Stateless functions; thread-safe.
#ifndef NORMD_CLIENT_CHECKPOINT_SAFETENSORS_H_
#define NORMD_CLIENT_CHECKPOINT_SAFETENSORS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace normd::client {

// One tensor of a file: its data is a view into the bytes parsed.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", "I64", ... as in the file.
  std::vector<int64_t> shape;
  absl::string_view data;  // Little-endian, row-major.
};

// The bytes of one element of a safetensors dtype; 0 if it is not one.
int64_t SafetensorsElementBytes(absl::string_view dtype);

// Parses a whole safetensors file. INVALID_ARGUMENT naming `file_name` (and
// the tensor, where there is one) unless: the header length fits the file
// and `max_header_bytes`; the header is one JSON object of tensors (plus an
// optional "__metadata__" object of strings), each named once, with a known
// dtype, a shape of dims >= 0 and [begin, end) offsets whose length is the
// shape's byte count; and the tensors cover the data exactly, without
// overlaps or holes. Tensors come back in the order of their offsets.
absl::StatusOr<std::vector<SafetensorsTensor>> ParseSafetensors(
    absl::string_view file, absl::string_view file_name,
    uint64_t max_header_bytes);

// A tensor to write: its dtype, shape and little-endian bytes.
struct SafetensorsOutput {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::string data;
};

// The bytes of a safetensors file holding `tensors` in order (the header
// padded with spaces to a multiple of 8, as the reference writer does).
// INVALID_ARGUMENT if a tensor's bytes do not match its dtype and shape or
// a name repeats.
absl::StatusOr<std::string> EncodeSafetensors(
    const std::vector<SafetensorsOutput>& tensors);

// Writes `bytes` to `path` atomically: into a temporary file beside it,
// flushed to disk, then renamed over `path` (readers see the old file or
// the whole new one, never a part).
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view bytes);

}  // namespace normd::client

#endif  // NORMD_CLIENT_CHECKPOINT_SAFETENSORS_H_

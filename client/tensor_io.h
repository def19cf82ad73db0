// Helpers for building and reading normd.v1.Tensor messages from C++: shapes
// and values as text, raw little-endian files, and readable printing.
// Stateless functions; thread-safe.
#ifndef NORMD_CLIENT_TENSOR_IO_H_
#define NORMD_CLIENT_TENSOR_IO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "normd/v1/normalizer.pb.h"

namespace normd::client {

// "2,3,4" -> {2, 3, 4}. INVALID_ARGUMENT naming `field` on bad numbers.
absl::StatusOr<std::vector<int64_t>> ParseShape(absl::string_view text,
                                                absl::string_view field);

// "1,2.5,-3e2" -> doubles (also nan, inf). INVALID_ARGUMENT naming `field`.
absl::StatusOr<std::vector<double>> ParseValues(absl::string_view text,
                                                absl::string_view field);

// "float32" / "float64" / "bfloat16" / "float16" (also f32 / f64).
absl::StatusOr<v1::DataType> ParseDataType(absl::string_view text);

// A tensor whose `data` holds `values` encoded as `dtype` (FLOAT32 values are
// rounded to float; BFLOAT16 / FLOAT16 once to nearest even).
v1::Tensor MakeTensor(const std::vector<int64_t>& shape,
                      const std::vector<double>& values,
                      v1::DataType dtype = v1::FLOAT32);

// A tensor whose `data` is the given raw little-endian bytes.
v1::Tensor MakeRawTensor(const std::vector<int64_t>& shape, std::string bytes,
                         v1::DataType dtype = v1::FLOAT32);

// The elements of a tensor of any dtype (data or values form) as doubles.
// INVALID_ARGUMENT if the length does not match the shape.
absl::StatusOr<std::vector<double>> TensorValues(const v1::Tensor& tensor);

// Reads a whole file; NOT_FOUND / UNAVAILABLE with the path on failure.
absl::StatusOr<std::string> ReadFile(const std::string& path);
absl::Status WriteFile(const std::string& path, absl::string_view bytes);

// A nested, readable rendering: [[1, 2, 3], [4, 5, 6]] (6 significant digits;
// at most `max_elements` shown, then "...").
std::string FormatTensor(const v1::Tensor& tensor, int64_t max_elements = 1000);

// "[1, 2.5, 3]" for a flat list.
std::string FormatList(const google::protobuf::RepeatedField<double>& values);

}  // namespace normd::client

#endif  // NORMD_CLIENT_TENSOR_IO_H_

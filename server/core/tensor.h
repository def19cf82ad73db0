// Tensor views used by the numeric core. The core never owns tensor memory:
// callers (the RPC layer, tests, benchmarks) hand it typed views of memory they
// own. Views are plain values; they are safe to share across threads as long
// as nobody writes the viewed memory concurrently.
#ifndef NORMD_SERVER_CORE_TENSOR_H_
#define NORMD_SERVER_CORE_TENSOR_H_

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace normd {

static_assert(std::endian::native == std::endian::little,
              "normd reads tensor bytes in place and assumes a little-endian "
              "host, as the wire format is little-endian");

// Element types of tensors. The core computes in fp32 and fp64; the 16-bit
// formats are stored as uint16_t bits and computed in fp32 (see half.h).
enum class DType { kFloat32, kFloat64, kBFloat16, kFloat16 };

// The DType of the floating-point element type T (float or double).
template <typename T>
constexpr DType FloatingDType() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>);
  return std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
}

// Bytes per element of `dtype`.
constexpr int64_t ElementSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    default:
      return 2;
  }
}

// "float32" / "float64" / "bfloat16" / "float16", for messages.
absl::string_view DTypeName(DType dtype);

using Shape = std::vector<int64_t>;

// The rank a tensor may have unless the server says otherwise (--max_rank).
inline constexpr int kDefaultMaxRank = 32;

// "[2,3,4]", for messages; past 12 dims, abbreviated to the first 8 and the
// last 2 with the rank ("[1,1,1,1,1,1,1,1,...,1,7] (rank 100000)"), so that
// an error message stays short whatever the request held.
std::string ShapeString(absl::Span<const int64_t> shape);

// The number of elements of `shape`; INVALID_ARGUMENT naming `field` if a dim
// is negative or the product overflows int64 (checked so that the byte size,
// product x 8, fits too).
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape,
                                    absl::string_view field);

// Read-only view of a dense row-major tensor of T.
template <typename T>
struct ConstTensorView {
  const T* data = nullptr;
  Shape shape;
  int64_t size = 0;  // Number of elements, = prod(shape).
};

// Writable view of a dense row-major tensor of T.
template <typename T>
struct TensorView {
  T* data = nullptr;
  int64_t size = 0;
};

// Tensor bytes that arrive split over several buffers (e.g. network receive
// buffers), in order, at any boundaries and alignment. Kernels that support
// it copy cache-sized pieces out as they go, instead of the caller gathering
// the whole tensor first. Owns only the list of chunks, not their bytes; a
// plain value, safe to read from many threads.
class ScatteredBytes {
 public:
  ScatteredBytes() = default;
  // Appends the next `chunk` of the tensor's bytes (empty chunks are skipped).
  void Append(absl::string_view chunk);
  // Total bytes appended.
  int64_t size() const { return starts_.back(); }
  // Copies bytes [from, from + n) into dst; requires from + n <= size().
  void CopyOut(int64_t from, int64_t n, void* dst) const;

 private:
  std::vector<absl::string_view> chunks_;
  std::vector<int64_t> starts_ = {0};  // starts_[i]: offset of chunks_[i].
};

}  // namespace normd

#endif  // NORMD_SERVER_CORE_TENSOR_H_

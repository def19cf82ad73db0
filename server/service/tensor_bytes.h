// A request tensor's elements as raw little-endian bytes, however its front
// end received them (a protobuf bytes field, a gRPC slice, an HTTP body),
// turned into the view the core reads: in place when the bytes are
// contiguous and aligned, piece by piece when they are scattered, from an
// aligned copy otherwise. Stateless; thread-safe.
#ifndef NORMD_SERVER_SERVICE_TENSOR_BYTES_H_
#define NORMD_SERVER_SERVICE_TENSOR_BYTES_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/engine.h"
#include "server/core/tensor.h"
#include "server/service/buffer_pool.h"

namespace normd {

// Where a tensor's bytes are: one contiguous range (any alignment), or the
// pieces of one (which must outlive the view made of them).
struct TensorBytes {
  std::optional<absl::string_view> contiguous;
  const ScatteredBytes* scattered = nullptr;

  int64_t size() const {
    return scattered != nullptr
               ? scattered->size()
               : static_cast<int64_t>(contiguous.value_or("").size());
  }
};

// What a view may point into: an aligned copy of misaligned bytes.
struct TensorStorage {
  PooledBuffer aligned{nullptr, &BufferPool::Release};
};

// Views `bytes` as a tensor of `dtype` and `shape` in `view`.
// INVALID_ARGUMENT naming `shape_field` for a negative or overflowing dim,
// naming `data_field` when the byte count is not the shape's. `view` may
// point into `bytes` or `storage`; keep both alive while it is in use.
absl::Status ViewTensorBytes(DType dtype, absl::Span<const int64_t> shape,
                             const TensorBytes& bytes,
                             absl::string_view shape_field,
                             absl::string_view data_field,
                             TensorStorage& storage, InputTensor& view);

// The elements of `tensor` as doubles (weights and biases, which the core
// takes in fp64).
std::vector<double> TensorToDoubles(const InputTensor& tensor);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_TENSOR_BYTES_H_

#include "server/core/tensor.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace normd {

absl::string_view DTypeName(DType dtype) {
  return dtype == DType::kFloat32 ? "float32" : "float64";
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape,
                                    absl::string_view field) {
  // Keep prod(shape) * 8 bytes representable.
  constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;
  int64_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    const int64_t dim = shape[i];
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: dim ", dim, " is negative"));
    }
    if (dim != 0 && count > kMaxElements / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": the product of the dims overflows (dim ", i,
                       " = ", dim, ")"));
    }
    count *= dim;
  }
  return count;
}

}  // namespace normd

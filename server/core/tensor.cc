#include "server/core/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace normd {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat16:
      return "float16";
  }
  return "unknown";
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  constexpr size_t kShownWhole = 12, kHead = 8, kTail = 2;
  if (shape.size() <= kShownWhole) {
    return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
  }
  return absl::StrCat("[", absl::StrJoin(shape.subspan(0, kHead), ","), ",...,",
                      absl::StrJoin(shape.subspan(shape.size() - kTail), ","),
                      "] (rank ", shape.size(), ")");
}

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape,
                                    absl::string_view field) {
  // Keep prod(shape) * 8 bytes representable, and also the product of the
  // nonzero dims: a zero dim makes the tensor empty, but products of the
  // other dims (outer / inner sizes of a layout) must not overflow either.
  constexpr int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;
  int64_t count = 1;
  bool empty = false;
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
    if (dim == 0) {
      empty = true;
    } else {
      count *= dim;
    }
  }
  return empty ? 0 : count;
}

void ScatteredBytes::Append(absl::string_view chunk) {
  if (chunk.empty()) return;
  chunks_.push_back(chunk);
  starts_.push_back(starts_.back() + static_cast<int64_t>(chunk.size()));
}

void ScatteredBytes::CopyOut(int64_t from, int64_t n, void* dst) const {
  char* out = static_cast<char*>(dst);
  // The chunk holding byte `from`: the last start <= from.
  size_t i = std::upper_bound(starts_.begin(), starts_.end() - 1, from) -
             starts_.begin() - 1;
  while (n > 0) {
    const int64_t begin = from - starts_[i];
    const int64_t take = std::min(n, starts_[i + 1] - from);
    std::memcpy(out, chunks_[i].data() + begin, static_cast<size_t>(take));
    out += take;
    from += take;
    n -= take;
    ++i;
  }
}

}  // namespace normd

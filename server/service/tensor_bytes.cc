#include "server/service/tensor_bytes.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/core/half.h"

namespace normd {

absl::Status ViewTensorBytes(DType dtype, absl::Span<const int64_t> shape,
                             const TensorBytes& bytes,
                             absl::string_view shape_field,
                             absl::string_view data_field,
                             TensorStorage& storage, InputTensor& view) {
  absl::StatusOr<int64_t> count = NumElements(shape, shape_field);
  if (!count.ok()) return count.status();
  const int64_t element_size = ElementSize(dtype);
  const int64_t size = bytes.size();
  if (size != *count * element_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        data_field, ": has ", size, " bytes but shape ", ShapeString(shape),
        " of ", DTypeName(dtype), " needs ", *count * element_size));
  }
  view.dtype = dtype;
  view.shape.assign(shape.begin(), shape.end());
  view.size = *count;
  view.data = nullptr;
  view.scattered = nullptr;
  if (size == 0) {
    if (bytes.contiguous.has_value()) view.data = bytes.contiguous->data();
    return absl::OkStatus();
  }
  if (bytes.scattered != nullptr) {
    view.scattered = bytes.scattered;
  } else if (reinterpret_cast<uintptr_t>(bytes.contiguous->data()) %
                 element_size ==
             0) {
    view.data = bytes.contiguous->data();
  } else {
    // Rare (short strings, odd offsets): copy to aligned storage.
    storage.aligned = AcquirePooled(static_cast<size_t>(size));
    std::memcpy(storage.aligned.get(), bytes.contiguous->data(),
                static_cast<size_t>(size));
    view.data = storage.aligned.get();
  }
  return absl::OkStatus();
}

std::vector<double> TensorToDoubles(const InputTensor& tensor) {
  InputTensor view = tensor;
  std::vector<double> gathered;  // Aligned for every dtype.
  if (view.scattered != nullptr) {
    gathered.resize(static_cast<size_t>(view.scattered->size() + 7) / 8);
    view.scattered->CopyOut(0, view.scattered->size(), gathered.data());
    view.data = gathered.data();
  }
  std::vector<double> values(static_cast<size_t>(view.size));
  if (view.dtype == DType::kFloat32) {
    const auto* src = static_cast<const float*>(view.data);
    for (int64_t i = 0; i < view.size; ++i) values[i] = src[i];
  } else if (IsHalf(view.dtype)) {
    const auto* src = static_cast<const uint16_t*>(view.data);
    for (int64_t i = 0; i < view.size; ++i) {
      values[i] = HalfToFloat(view.dtype, src[i]);
    }
  } else if (view.size > 0) {
    std::memcpy(values.data(), view.data, view.size * sizeof(double));
  }
  return values;
}

}  // namespace normd

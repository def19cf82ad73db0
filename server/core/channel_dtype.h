// The element types of the channel paths (BatchNorm, GroupNorm,
// InstanceNorm, Fit) as C++ types, for code templated on them: fp32, fp64,
// and the 16-bit dtypes, stored as their bits (Storage<Half<...>> is
// uint16_t) and computed as their fp32 widening by ChannelMoments and
// ChannelAffineKernel, so that a 16-bit tensor gets the bits of a widened
// copy normalized and narrowed, without the copy. Header-only, stateless.
#ifndef NORMD_SERVER_CORE_CHANNEL_DTYPE_H_
#define NORMD_SERVER_CORE_CHANNEL_DTYPE_H_

#include <cstdint>
#include <type_traits>

#include "server/core/kernels.h"
#include "server/core/layout.h"
#include "server/core/tensor.h"

namespace normd {

template <DType kType>
struct Half {
  static constexpr DType kDType = kType;
};
template <typename T>
struct StorageOf {
  using type = T;
};
template <DType kType>
struct StorageOf<Half<kType>> {
  using type = uint16_t;
};
template <typename T>
using Storage = typename StorageOf<T>::type;
template <typename T>
constexpr bool kIsHalf = !std::is_floating_point_v<T>;

// Calls f with a null pointer of the channel-path element type of `dtype`.
template <typename F>
decltype(auto) VisitChannelDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBFloat16:
      return f(static_cast<Half<DType::kBFloat16>*>(nullptr));
    case DType::kFloat16:
      return f(static_cast<Half<DType::kFloat16>*>(nullptr));
    case DType::kFloat32:
      return f(static_cast<float*>(nullptr));
    case DType::kFloat64:
      break;
  }
  return f(static_cast<double*>(nullptr));
}

// The DType of element type T.
template <typename T>
constexpr DType DTypeOf() {
  if constexpr (kIsHalf<T>) {
    return T::kDType;
  } else {
    return FloatingDType<T>();
  }
}
// ChannelAffineKernel of contiguous elements of type T.
template <typename T>
void ChannelAffineOf(const Storage<T>* x, Storage<T>* y,
                     const ChannelLayout& layout, const double* mean,
                     const double* scale, const double* shift,
                     int64_t output_elements = 0,
                     Traversal traversal = Traversal::kParallel) {
  ChannelAffineKernel(DTypeOf<T>(), {reinterpret_cast<const char*>(x)}, y,
                      layout, mean, scale, shift, output_elements, traversal);
}

}  // namespace normd

#endif  // NORMD_SERVER_CORE_CHANNEL_DTYPE_H_

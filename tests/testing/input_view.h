// A core InputTensor viewing a test's std::vector. Test-only.
#ifndef NORMD_TESTS_TESTING_INPUT_VIEW_H_
#define NORMD_TESTS_TESTING_INPUT_VIEW_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "server/core/engine.h"

namespace normd::testing {

// The DType of float / double vectors (16-bit tensors are uint16_t vectors
// and name their dtype).
template <typename T>
constexpr DType DTypeOf() {
  return FloatingDType<T>();
}

// x seen as a tensor of `shape` (x.size() elements of `dtype`).
template <typename T>
InputTensor View(const std::vector<T>& x, Shape shape,
                 DType dtype = DTypeOf<T>()) {
  InputTensor in;
  in.dtype = dtype;
  in.shape = std::move(shape);
  in.data = x.data();
  in.size = static_cast<int64_t>(x.size());
  return in;
}

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_INPUT_VIEW_H_

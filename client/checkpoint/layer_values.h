// What every checkpoint reader shares: 16-bit floats widened to double, and
// the checks a BatchNorm layer's tensors must pass before they are sent.
// Stateless functions; thread-safe.
#ifndef NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_
#define NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/checkpoint/checkpoint.h"

namespace normd::client {

// IEEE binary16 and bfloat16 bit patterns as doubles (exact).
double HalfBitsToDouble(uint16_t bits);
double BFloat16BitsToDouble(uint16_t bits);

// INVALID_ARGUMENT naming `file_name`, the layer and the tensor unless the
// layer's tensors all have one length C >= 1 (weight and bias may be
// absent), every value is finite and no variance is negative.
absl::Status CheckLayer(const CheckpointLayer& layer,
                        absl::string_view file_name);

}  // namespace normd::client

#endif  // NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_

// What every checkpoint reader shares: little-endian values read from bytes,
// 16-bit floats widened to double, shapes as text, and the checks a
// BatchNorm layer's tensors must pass before they are sent. Stateless
// functions; thread-safe.
#ifndef NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_
#define NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/checkpoint/checkpoint.h"

namespace normd::client {

// The value of type T (an integer or a float of 2, 4 or 8 bytes) stored
// little-endian at `bytes`, whatever the host's byte order and alignment.
template <typename T>
T LoadLittleEndian(const char* bytes) {
  using Bits = std::conditional_t<
      sizeof(T) == 8, uint64_t,
      std::conditional_t<sizeof(T) == 4, uint32_t, uint16_t>>;
  Bits bits = 0;
  for (int i = sizeof(T) - 1; i >= 0; --i) {
    bits =
        static_cast<Bits>((bits << 8) | static_cast<unsigned char>(bytes[i]));
  }
  T value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// "[2, 3]".
std::string ShapeText(const std::vector<int64_t>& shape);

// IEEE binary16 and bfloat16 bit patterns as doubles (exact).
double HalfBitsToDouble(uint16_t bits);
double BFloat16BitsToDouble(uint16_t bits);

// The float types a BatchNorm statistic may be stored in, in either format.
enum class FloatKind { kFloat32, kFloat64, kFloat16, kBFloat16 };

// The bytes of one element of `kind`.
int64_t ElementBytes(FloatKind kind);

// A 16-bit kind's bit pattern as a double (exact).
double SixteenBitsToDouble(FloatKind kind, uint16_t bits);

// Element `index` of little-endian `kind` values at `bytes`, widened
// exactly.
double WidenElement(FloatKind kind, const char* bytes, int64_t index);

// INVALID_ARGUMENT naming `file_name`, the layer and the tensor unless the
// layer's tensors all have one length C >= 1 (weight and bias may be
// absent), every value is finite and no variance is negative.
absl::Status CheckLayer(const CheckpointLayer& layer,
                        absl::string_view file_name);

}  // namespace normd::client

#endif  // NORMD_CLIENT_CHECKPOINT_LAYER_VALUES_H_

// StreamCopy on every SIMD target compiled in: the bytes of memcpy for every
// head and tail around the 64-byte lines, and nothing written outside the
// destination.
#include "server/core/simd/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "server/core/simd/target.h"
#include "tests/testing/simd_targets.h"

namespace normd {
namespace {

using ::normd::testing::ForEachSimdTarget;
using ::normd::testing::SimdTargets;

TEST(StreamCopyTest, EveryTargetCopiesEveryHeadAndTailExactly) {
#if defined(__x86_64__)
  if (std::getenv(kSimdTargetVariable) == nullptr) {
    ASSERT_GE(SimdTargets().size(), 2u) << "expected a fallback beside the "
                                           "best target";
  }
#endif
  std::mt19937 rng(7);
  std::vector<uint8_t> src(3 * 4096 + 200);
  for (uint8_t& b : src) b = static_cast<uint8_t>(rng());
  int targets = 0;
  ForEachSimdTarget([&](const std::string& target) {
    ++targets;
    // Destination offsets 0..64 around a line, sizes across 0..3 lines
    // and a large copy; guard bytes on both sides.
    for (size_t offset = 0; offset <= 64; offset += 1) {
      for (size_t bytes :
           {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65},
            size_t{127}, size_t{128}, size_t{200}, size_t{3 * 4096 + 7}}) {
        std::vector<uint8_t> buffer(bytes + 256, 0xA5);
        uint8_t* base = buffer.data();
        // Align base up to 64 (vector storage is at least 16-aligned).
        const size_t pad = (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
        if (pad + offset + bytes + 1 > buffer.size()) continue;
        uint8_t* dst = base + pad + offset;
        StreamCopy(dst, src.data() + offset % 7, bytes);
        ASSERT_EQ(std::memcmp(dst, src.data() + offset % 7, bytes), 0)
            << "offset " << offset << " bytes " << bytes;
        for (uint8_t* p = buffer.data(); p < dst; ++p) ASSERT_EQ(*p, 0xA5);
        for (uint8_t* p = dst + bytes; p < buffer.data() + buffer.size(); ++p) {
          ASSERT_EQ(*p, 0xA5) << "written past the end";
        }
      }
    }
  });
  EXPECT_EQ(targets, static_cast<int>(SimdTargets().size()));
}

}  // namespace
}  // namespace normd

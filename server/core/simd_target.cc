#include "server/core/simd_target.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "server/core/simd_target.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
// foreach_target.h first: it re-includes this file once per target.
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace normd {
namespace HWY_NAMESPACE {

const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace normd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace normd {

HWY_EXPORT(TargetName);

const char* DispatchedSimdTarget() {
  return HWY_DYNAMIC_DISPATCH(TargetName)();
}

}  // namespace normd
#endif  // HWY_ONCE

// The Engine's drift observation (see engine.h, drift_monitor.h).
#include <vector>

#include "server/core/engine.h"
#include "server/core/kernels.h"

namespace normd {

std::optional<DriftReport> Engine::Drift(const BatchNormModel& model) const {
  if (!model.reference.has_value()) return std::nullopt;
  return MeasureDrift(*model.reference,
                      drift_.Window(model.name, model.num_features), model.eps,
                      drift_.options());
}

void Engine::Observe(const BatchNormModel& model,
                     absl::Span<const Moments> moments) {
  if (!model.reference.has_value() || !drift_.ShouldObserve(model.name)) {
    return;
  }
  AddFiniteObservation(model.name, moments);
}

bool Engine::NormalizeObserved(const BatchNormModel& model,
                               const InputTensor& input,
                               const ChannelLayout& layout, const double* mean,
                               const double* scale, const double* shift,
                               void* output) {
  if (!model.reference.has_value() || !drift_.ShouldObserve(model.name)) {
    return false;
  }
  // Scattered input is gathered first: the blocks of the moments are not
  // the pieces it arrives in.
  std::vector<char> storage;
  const InputTensor whole = Contiguous(input, storage);
  AddFiniteObservation(model.name,
                       ChannelAffineWithMoments(whole.dtype, whole.data, output,
                                                layout, mean, scale, shift));
  return true;
}

void Engine::AddFiniteObservation(absl::string_view name,
                                  absl::Span<const Moments> moments) {
  for (const Moments& m : moments) {
    if (!m.IsFinite()) return;
  }
  drift_.Observe(name, moments);
}

}  // namespace normd

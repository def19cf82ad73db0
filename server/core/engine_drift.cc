// The Engine's drift observation (see engine.h, drift_monitor.h).
#include <vector>

#include "server/core/engine.h"

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

void Engine::ObserveEval(const BatchNormModel& model, const InputTensor& input,
                         const ChannelLayout& layout) {
  if (!model.reference.has_value() || input.size == 0 ||
      !drift_.ShouldObserve(model.name)) {
    return;
  }
  std::vector<char> storage;
  const InputTensor whole = Contiguous(input, storage);
  AddFiniteObservation(model.name,
                       ChannelMoments(whole.dtype, whole.data, layout));
}

void Engine::AddFiniteObservation(absl::string_view name,
                                  absl::Span<const Moments> moments) {
  for (const Moments& m : moments) {
    if (!m.IsFinite()) return;
  }
  drift_.Observe(name, moments);
}

}  // namespace normd

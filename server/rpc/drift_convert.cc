#include "server/rpc/drift_convert.h"

namespace normd {
namespace {

// The wire's enum as the core's; 0 (unspecified) and unknown values map to
// 0, which no check accepts.
ReferenceSource FromWire(v1::ReferenceSource source) {
  const int value = source;
  return static_cast<ReferenceSource>(
      value >= static_cast<int>(ReferenceSource::kRunning) &&
              value <= static_cast<int>(ReferenceSource::kCheckpoint)
          ? value
          : 0);
}

v1::ReferenceSource ToWire(ReferenceSource source) {
  return static_cast<v1::ReferenceSource>(static_cast<int>(source));
}

}  // namespace

ReferenceRequest ToReferenceRequest(const v1::SetReferenceRequest& request) {
  return {.source = FromWire(request.source()),
          .mean = {request.mean().begin(), request.mean().end()},
          .var = {request.var().begin(), request.var().end()}};
}

std::optional<DriftReference> ToDriftReference(const v1::ModelState& state) {
  if (!state.has_reference()) return std::nullopt;
  const v1::DriftReference& in = state.reference();
  return DriftReference{.source = FromWire(in.source()),
                        .set_unix_nanos = in.set_unix_nanos(),
                        .mean = {in.mean().begin(), in.mean().end()},
                        .var = {in.var().begin(), in.var().end()}};
}

void ToDriftReferenceMessage(const DriftReference& reference, bool with_arrays,
                             v1::DriftReference& out) {
  out.set_source(ToWire(reference.source));
  out.set_set_unix_nanos(reference.set_unix_nanos);
  if (!with_arrays) return;
  out.mutable_mean()->Assign(reference.mean.begin(), reference.mean.end());
  out.mutable_var()->Assign(reference.var.begin(), reference.var.end());
}

void ToDriftReportMessage(const DriftReport& report, bool with_arrays,
                          v1::DriftReport& out) {
  out.set_reference_source(ToWire(report.reference_source));
  out.set_reference_set_unix_nanos(report.reference_set_unix_nanos);
  out.set_window_samples(report.window_samples);
  out.set_window_seconds(report.window_seconds);
  if (!report.measures.has_value()) return;
  const DriftMeasures& m = *report.measures;
  out.set_kl_max(m.kl_max);
  out.set_kl_mean(m.kl_mean);
  out.set_shift_max(m.shift_max);
  out.set_channels_drifted(m.channels_drifted);
  if (!with_arrays) return;
  out.mutable_kl()->Assign(m.kl.begin(), m.kl.end());
  out.mutable_shift()->Assign(m.shift.begin(), m.shift.end());
}

}  // namespace normd

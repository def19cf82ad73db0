// Translation between the native API's drift messages (ReferenceSource,
// DriftReference, DriftReport, SetReferenceRequest) and the core's. Plain
// functions.
#ifndef NORMD_SERVER_RPC_DRIFT_CONVERT_H_
#define NORMD_SERVER_RPC_DRIFT_CONVERT_H_

#include <optional>

#include "normd/v1/normalizer.pb.h"
#include "server/core/drift_measures.h"
#include "server/core/drift_reference.h"

namespace normd {

// The request as the store takes it; an unspecified or unknown source
// becomes one ValidateReferenceRequest refuses.
ReferenceRequest ToReferenceRequest(const v1::SetReferenceRequest& request);

// ModelState.reference as received (ImportModel, MergeModel's source), or
// nullopt when absent; validated with the model.
std::optional<DriftReference> ToDriftReference(const v1::ModelState& state);

// Fills `out` from `reference`, with its arrays when `with_arrays`.
void ToDriftReferenceMessage(const DriftReference& reference, bool with_arrays,
                             v1::DriftReference& out);

// Fills `out` from `report`, with its per-channel arrays when `with_arrays`.
void ToDriftReportMessage(const DriftReport& report, bool with_arrays,
                          v1::DriftReport& out);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_DRIFT_CONVERT_H_

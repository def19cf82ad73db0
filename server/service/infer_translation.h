// The Open Inference Protocol's one translation: an infer request becomes
// the native Normalize or Fit it stands for, on the core's types, so that
// both protocols give the same bytes and the same errors. Problems only OIP
// can have (datatype strings, parameters, input and output names) get
// INVALID_ARGUMENT naming the OIP field. The parameters KServe and Triton
// clients send that mean nothing to normd are accepted and ignored; any
// other unknown name is refused, so that a misspelt parameter never
// silently changes a result. Stateless; thread-safe.
#ifndef NORMD_SERVER_SERVICE_INFER_TRANSLATION_H_
#define NORMD_SERVER_SERVICE_INFER_TRANSLATION_H_

#include <array>
#include <string>

#include "absl/status/status.h"
#include "server/core/engine.h"
#include "server/service/infer_request.h"
#include "server/service/tensor_bytes.h"

namespace normd {

// An infer request as a native call. The specs' tensors view the request's
// bytes (or `storage`): keep both alive while it is in use, and do not move
// it.
struct NativeInfer {
  bool fit = false;         // Fit (the parameter fit), else Normalize.
  bool batch_norm = false;  // A store model: counters in the reply.
  NormalizeSpec normalize;  // When !fit.
  FitSpec fit_spec;         // When fit.
  InferOutputPlan output;
  // Aligned copies of misaligned input, weight and bias bytes.
  std::array<TensorStorage, 3> storage;
};

// Translates `request` into `call`. INVALID_ARGUMENT naming the OIP field
// for anything OIP-specific that is wrong; NOT_FOUND for a model version
// other than "1" (after every such INVALID_ARGUMENT); then the tensors'
// shapes and byte counts. What the native API checks itself (modes'
// parameters, values, model names) it reports itself when the call runs.
absl::Status TranslateInfer(const InferRequest& request, NativeInfer& call);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_INFER_TRANSLATION_H_

// The one place that converts between normd.v1 protobuf messages and the
// numeric core's types. It checks everything about a message that the core
// cannot see (dtype values, data/values lengths, presence), naming the
// offending field in every INVALID_ARGUMENT. Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_CONVERT_H_
#define NORMD_SERVER_RPC_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "normd/v1/normalizer.pb.h"
#include "server/core/engine.h"
#include "server/core/model.h"

namespace normd {

// A request tensor viewed by the core. The view points into the request's
// `data` bytes when they can be read in place, else into `storage` (the
// `values` form, or misaligned bytes); keep the message alive while in use.
struct ParsedTensor {
  InputTensor view;
  bool values_form = false;  // The request used `values`.
  std::vector<double> storage;
  std::vector<float> storage_f32;
};

// Parses `tensor`; `field` names it in errors (e.g. "input").
// INVALID_ARGUMENT for unknown dtypes, bad dims, both or neither of
// data/values, or a length that does not match the shape; UNIMPLEMENTED for
// BFLOAT16/FLOAT16. `out` must not move while its view is in use.
absl::Status ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                         ParsedTensor& out);

// A NormalizeRequest in core form, with the storage its views point into.
struct ParsedNormalize {
  NormalizeSpec spec;
  ParsedTensor input;
};

// Parses a NormalizeRequest; `out` must not move afterwards.
absl::Status ParseNormalizeRequest(const v1::NormalizeRequest& request,
                                   ParsedNormalize& out);

// A FitRequest in core form, with the storage its view points into.
struct ParsedFit {
  FitSpec spec;
  ParsedTensor input;
};

// Parses a FitRequest; `out` must not move afterwards.
absl::Status ParseFitRequest(const v1::FitRequest& request, ParsedFit& out);

// CreateModelRequest -> ModelSpec (the core validates values).
ModelSpec ToModelSpec(const v1::CreateModelRequest& request);

// Writes `model` into `state`; per-channel arrays only if `with_arrays`.
void ToModelState(const BatchNormModel& model, bool with_arrays,
                  v1::ModelState& state);

// Prepares `out` as the output tensor for `input` (same dtype and shape) and
// returns where the core should write the elements: straight into
// out.data (sized, not yet filled) or, for the values form, into `scratch`,
// after which CopyValuesOutput moves them into out.values.
void* PrepareOutput(const v1::Tensor& request_tensor, const ParsedTensor& input,
                    std::vector<double>& scratch, v1::Tensor& out);
void CopyValuesOutput(const ParsedTensor& input,
                      const std::vector<double>& scratch, v1::Tensor& out);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_CONVERT_H_

// The one place that converts between normd.v1 protobuf messages and the
// numeric core's types. It checks everything about a message that the core
// cannot see (dtype values, data/values lengths, presence), naming the
// offending field in every INVALID_ARGUMENT. Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_CONVERT_H_
#define NORMD_SERVER_RPC_CONVERT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "normd/v1/normalizer.pb.h"
#include "server/core/engine.h"
#include "server/core/model.h"
#include "server/service/buffer_pool.h"
#include "server/service/tensor_bytes.h"

namespace normd {

// A request tensor viewed by the core. The view points into the request's
// `data` bytes when they can be read in place, else into `storage` (the
// `values` form, or misaligned bytes); keep the message alive while in use.
struct ParsedTensor {
  InputTensor view;
  bool values_form = false;  // The request used `values`.
  std::vector<double> storage;
  std::vector<float> storage_f32;
  std::vector<uint16_t> storage_u16;  // BFLOAT16 / FLOAT16 values.
  TensorStorage storage_bytes;        // An aligned copy of `data`.
};

// Parses `tensor`; `field` names it in errors (e.g. "input").
// INVALID_ARGUMENT for unknown dtypes, bad dims, both or neither of
// data/values, or a length that does not match the shape. `values` of a
// 16-bit dtype are rounded to it (nearest even). `data`, if given, replaces
// tensor.data() (the raw path keeps the bytes outside the message), and
// `scattered`, if given, replaces both (the view then reads the chunks, which
// must outlive it). `out` must not move while its view is in use.
absl::Status ParseTensor(const v1::Tensor& tensor, absl::string_view field,
                         ParsedTensor& out,
                         std::optional<absl::string_view> data = std::nullopt,
                         const ScatteredBytes* scattered = nullptr);

// A NormalizeRequest in core form, with the storage its views point into.
struct ParsedNormalize {
  NormalizeSpec spec;
  ParsedTensor input;
};

// Parses a NormalizeRequest; `out` must not move afterwards. `input_data`
// or `scattered_input`, if given, stands for request.input().data().
absl::Status ParseNormalizeRequest(
    const v1::NormalizeRequest& request, ParsedNormalize& out,
    std::optional<absl::string_view> input_data = std::nullopt,
    const ScatteredBytes* scattered_input = nullptr);

// --- The raw (zero-copy) form of Normalize -------------------------------
//
// A serialized NormalizeRequest arrives as gRPC slices. SplitNormalizeRequest
// reads the wire format once: everything but input.data goes into `message`
// (parsed by protobuf, so field semantics are protobuf's own), and
// input.data is left where it is: a view into the slices when it lies in one
// suitably aligned slice, else the list of its pieces (`scattered`), which
// the core reads piece by piece where it can (Engine::ReadsScatteredInPlace)
// and GatherInput copies into one pooled buffer where it cannot.
struct SplitRequest {
  v1::NormalizeRequest message;                 // With input.data empty.
  std::optional<absl::string_view> input_data;  // Set when present.
  std::optional<ScatteredBytes> scattered;      // Set when split/misaligned.
  PooledBuffer gathered{nullptr, &BufferPool::Release};  // See GatherInput.
};

// INVALID_ARGUMENT if the bytes are not a NormalizeRequest. Requests whose
// wire form is unusual (input or input.data repeated, which protobuf merges)
// are parsed whole by protobuf instead; the result means the same either way.
absl::Status SplitNormalizeRequest(absl::Span<const absl::string_view> chunks,
                                   SplitRequest& out);

// Points `parsed`'s input at one contiguous copy of its scattered bytes,
// held by `gathered` (from the buffer pool); nothing to do if the input is
// not scattered.
void GatherInput(ParsedNormalize& parsed, PooledBuffer& gathered);

// The entries of a repeated bytes field at the top level of a serialized
// message (the Open Inference Protocol's raw_input_contents), left where they
// lie in the slices.
struct WireEntry {
  std::optional<absl::string_view> contiguous;  // When in one slice.
  ScatteredBytes pieces;                        // Always.
};

// Splits the message in `chunks` into the entries of field `field` (length
// delimited, at the top level) and every other byte, in order, in `rest`.
// False if the bytes are not well-formed wire format (let protobuf say what
// they are).
bool SplitTopLevelField(absl::Span<const absl::string_view> chunks,
                        uint32_t field, std::string& rest,
                        std::vector<WireEntry>& entries);

// A NormalizeResponse whose output.data payload is written in place: the
// serialized response is head + payload + tail, byte-identical to protobuf's
// serialization of the same message.
struct ResponseFrame {
  std::string head;  // Fields up to and including output.data's length.
  std::string tail;  // request_id and model.
};

// Appends the key of a length-delimited field `field` holding `length`
// bytes (its tag and length), e.g. before a payload written in place.
void AppendLengthDelimitedKey(uint32_t field, int64_t length, std::string& out);

// Builds the frame for a response with `output` (its data empty; the payload
// of `payload_bytes` goes there) and the other fields from `rest` (its output
// and error unset).
ResponseFrame MakeResponseFrame(const v1::Tensor& output, int64_t payload_bytes,
                                const v1::NormalizeResponse& rest);

// A FitRequest in core form, with the storage its view points into.
struct ParsedFit {
  FitSpec spec;
  ParsedTensor input;
};

// Parses a FitRequest; `out` must not move afterwards.
absl::Status ParseFitRequest(const v1::FitRequest& request, ParsedFit& out);

// CreateModelRequest -> ModelSpec (the core validates values).
ModelSpec ToModelSpec(const v1::CreateModelRequest& request);

// ModelState (ImportModel's model, MergeModel's source) -> ModelStateSpec
// (the core validates values).
ModelStateSpec ToModelStateSpec(const v1::ModelState& state);

// Writes `model` into `state`; per-channel arrays only if `with_arrays`,
// and of the drift reference only its source and time (GetModel,
// ExportModel and SetReference add its arrays: WithReferenceArrays).
void ToModelState(const BatchNormModel& model, bool with_arrays,
                  v1::ModelState& state);
// Adds the arrays of `model`'s drift reference, if any, to `state`.
void WithReferenceArrays(const BatchNormModel& model, v1::ModelState& state);

// Sets `out`'s dtype and shape to those of the request's tensor.
void SetOutputMeta(const v1::Tensor& request_tensor, v1::Tensor& out);

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

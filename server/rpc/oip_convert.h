// The Open Inference Protocol's gRPC messages (inference.*) to and from the
// service's protocol-free form (server/service/infer_request.h,
// inference.h): the gRPC service's one translation. Only what is particular
// to the protobuf form is checked here (raw_input_contents against the
// inputs, typed contents against the datatype, mixing the two); everything
// else is the service's, so that gRPC and REST give the same answers.
// Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_OIP_CONVERT_H_
#define NORMD_SERVER_RPC_OIP_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "inference/grpc_predict_v2.pb.h"
#include "server/service/infer_request.h"
#include "server/service/inference.h"

namespace normd {

// The field number of ModelInferRequest.raw_input_contents.
inline constexpr uint32_t kRawInputContentsField = 7;

// `message` as the service's request. `raw` holds input i's bytes when the
// message used raw_input_contents (those of the message itself, or the
// entries the raw path left in the request's slices); typed contents are
// converted into `typed` (one string per input; keep it alive with the
// request). INVALID_ARGUMENT naming the field for a raw_input_contents count
// that is not the inputs', typed contents beside raw ones, or typed contents
// in a field the datatype does not use.
absl::Status ToInferRequest(const inference::ModelInferRequest& message,
                            absl::Span<const TensorBytes> raw,
                            std::vector<std::string>& typed,
                            InferRequest& request);

// The raw entries of `message`'s own raw_input_contents.
std::vector<TensorBytes> RawContentsOf(
    const inference::ModelInferRequest& message);

// The ModelInferResponse to `message` for `reply` without the output's
// elements: with raw contents, serialized and followed by the key of one
// raw_output_contents entry of the output's bytes (the bytes themselves
// follow it on the wire); into `head`, replacing what it held.
void OipRawResponseHead(const inference::ModelInferRequest& message,
                        const InferReply& reply, std::string& head);

// The ModelInferResponse to `message` for `reply` with the output's
// elements `output` (raw contents when `raw`, else typed fp32/fp64
// contents).
void ToModelInferResponse(const inference::ModelInferRequest& message,
                          const InferReply& reply, absl::string_view output,
                          bool raw, inference::ModelInferResponse& response);

void ToModelMetadataResponse(const OipModelMetadata& metadata,
                             inference::ModelMetadataResponse& response);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_OIP_CONVERT_H_

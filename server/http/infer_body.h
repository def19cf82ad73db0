// The body of a REST infer request (POST /v2/models/{model}/infer): the
// Open Inference Protocol's JSON, and Triton's binary-data extension (raw
// tensors after the JSON, whose length the Inference-Header-Content-Length
// header gives), into the service's InferRequest. JSON is parsed with
// simdjson (DOM: keys in any order, every number parsed once, exactly, in
// time linear in the body: duplicate keys are found with a hash set, arrays
// of any length counted exactly). JSON numbers become the nearest double,
// then the datatype's nearest value, as Python's json and numpy's astype do
// (one that is not finite there is INVALID_ARGUMENT naming the element);
// binary tensors are viewed in place in the body.
//
// Stateless; thread-safe.
#ifndef NORMD_SERVER_HTTP_INFER_BODY_H_
#define NORMD_SERVER_HTTP_INFER_BODY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "server/service/infer_request.h"

namespace normd {

// The header of the binary-data extension: the length of the JSON part of a
// body whose binary tensors follow it.
inline constexpr char kInferenceHeaderContentLength[] =
    "Inference-Header-Content-Length";

// simdjson reads up to this many bytes past the end of a JSON text: a body
// buffer with this much spare capacity is parsed in place, without a copy.
size_t JsonPadding();

// A REST infer request as the service's. Its tensors view the body (binary
// data) and `decoded` (JSON data as raw bytes, on the heap: the request may
// move): keep the body alive while it is in use.
struct RestInferRequest {
  InferRequest request;
  std::vector<std::vector<char>> decoded;  // One per input.
  // The output goes back as binary data after the JSON (requested with
  // "binary_data" on the output or "binary_data_output" in the request's
  // parameters), else as JSON numbers.
  bool binary_output = false;
};

// Parses `body` for model `model` at `version` ("": none in the path).
// `header_length` is the Inference-Header-Content-Length header's value
// (nullopt when absent: the whole body is JSON). `body_capacity`: how many
// bytes past body.data() may be read (>= body.size() + JsonPadding() lets
// the JSON be parsed without a copy). INVALID_ARGUMENT naming the field (or
// the header) for anything malformed; what the Open Inference Protocol
// itself checks (datatypes, input names, parameters) is left to the service,
// so that REST and gRPC give the same message for it.
absl::Status ParseInferBody(absl::string_view body, size_t body_capacity,
                            std::optional<absl::string_view> header_length,
                            absl::string_view model, absl::string_view version,
                            RestInferRequest& out);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_INFER_BODY_H_

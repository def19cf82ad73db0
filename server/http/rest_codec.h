// The REST front-end's one translation: the Open Inference Protocol's JSON
// bodies (and Triton's binary-data extension) to and from the inference.*
// messages that the OIP gRPC service takes, so that REST runs exactly the
// OIP calls (and through them the native ones) and nothing else.
//
// JSON is parsed with simdjson (DOM: keys in any order, every number parsed
// once, at memory speed) and written with std::to_chars (shortest
// round-trip). Tensor elements always travel as raw little-endian bytes in
// the message, whatever their JSON form, so that FP16 and BF16 work from JSON
// too. A JSON number becomes the nearest double, then the datatype's nearest
// value, as Python's json and numpy's astype do; one that is not finite
// there is INVALID_ARGUMENT naming the element.
//
// Stateless; thread-safe.
#ifndef NORMD_SERVER_HTTP_REST_CODEC_H_
#define NORMD_SERVER_HTTP_REST_CODEC_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_predict_v2.pb.h"

namespace normd {

// The header of the binary-data extension: the length of the JSON part of a
// body whose binary tensors follow it.
inline constexpr char kInferenceHeaderContentLength[] =
    "Inference-Header-Content-Length";

// A REST infer request as the OIP message it stands for.
struct RestInferRequest {
  inference::ModelInferRequest message;
  // The output goes back as binary data after the JSON (requested with
  // "binary_data" on the output or "binary_data_output" in the request's
  // parameters), else as JSON numbers.
  bool binary_output = false;
};

// Parses the body of POST /v2/models/{model}[/versions/{version}]/infer.
// `header_length` is the Inference-Header-Content-Length header's value
// (nullopt when absent: the whole body is JSON). INVALID_ARGUMENT naming the
// field (or the header) for anything malformed; what OIP itself checks
// (datatypes, input names, parameters) is left to the OIP translation, so
// that REST and gRPC give the same message for it.
absl::Status ParseRestInferRequest(
    absl::string_view body, std::optional<absl::string_view> header_length,
    absl::string_view model, absl::string_view version,
    RestInferRequest& request);

// A response body; with binary data, its first `json_bytes` bytes are JSON.
struct RestBody {
  std::string bytes;
  std::optional<size_t> json_bytes;  // Set when binary data follows.
};

// The body answering `request` with `response` (whose raw output contents
// are moved out).
void FormatRestInferResponse(inference::ModelInferResponse& response,
                             bool binary_output, RestBody& body);

// The JSON bodies of the other endpoints.
std::string ServerMetadataJson(
    const inference::ServerMetadataResponse& response);
std::string ModelMetadataJson(const inference::ModelMetadataResponse& response);
std::string ModelReadyJson(absl::string_view name, bool ready);
// {"live": true} / {"ready": <ready>}.
std::string HealthJson(absl::string_view key, bool value);
// {"error": "<message>"}.
std::string ErrorJson(absl::string_view message);

// Appends `text` as a JSON string (quoted, escaped).
void AppendJsonString(absl::string_view text, std::string& out);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_CODEC_H_

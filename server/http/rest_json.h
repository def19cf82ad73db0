// The JSON bodies the REST front end answers with: an infer reply (numbers
// written with std::to_chars, the shortest decimal that reads back to the
// same float or double, so that JSON round-trips bit for bit; or the
// binary-data extension's JSON head), the other endpoints' replies, and
// errors. Only fields normd writes itself, so a writer, not a library.
// Stateless; thread-safe.
#ifndef NORMD_SERVER_HTTP_REST_JSON_H_
#define NORMD_SERVER_HTTP_REST_JSON_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/service/infer_request.h"
#include "server/service/inference.h"

namespace normd {

// Appends `text` as a JSON string (quoted, escaped; bytes that are not
// valid UTF-8 written as U+FFFD, so that the JSON is always valid).
void AppendJsonString(absl::string_view text, std::string& out);

// The most bytes FormatInferReply writes for an output of `elements` values
// of `dtype` as JSON numbers, beside the head (for admission).
int64_t JsonOutputBytes(DType dtype, int64_t elements);

// The infer reply to model `model`'s request `id`: its head and, unless
// `binary_output`, the output's values `output` as JSON numbers. With
// binary output the output's bytes follow the returned JSON in the body
// (the caller sends them; their count is in the head).
std::string FormatInferReply(absl::string_view model, absl::string_view id,
                             const InferReply& reply, absl::string_view output,
                             bool binary_output);

std::string ServerMetadataJson(const OipServerMetadata& metadata);
std::string ModelMetadataJson(const OipModelMetadata& metadata);
std::string ModelReadyJson(absl::string_view name, bool ready);
// {"live": true} / {"ready": <ready>}.
std::string HealthJson(absl::string_view key, bool value);
// [{"name", "version", "state"}, ...].
std::string RepositoryIndexJson(const std::vector<OipRepositoryEntry>& index);
// Triton's model configuration: name, platform, max_batch_size 0, input and
// output (name, data_type "TYPE_FP32", dims), parameters ({"key":
// {"string_value": "..."}}).
std::string ModelConfigJson(const OipModelConfig& config);
// Triton's statistics: {"model_stats": [{"name", "version",
// "last_inference", "inference_count", "execution_count", "inference_stats":
// {"success": {"count", "ns"}, "fail": {"count", "ns"}}, and for a model
// with a drift reference "drift": {"reference_source",
// "reference_set_unix_nanos", "window_samples", "window_seconds", and when
// measured "kl_max", "kl_mean", "shift_max", "channels_drifted"}}]}.
std::string ModelStatisticsJson(const std::vector<OipModelStatistics>& stats);
// {"error": "<message>"}.
std::string ErrorJson(absl::string_view message);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REST_JSON_H_

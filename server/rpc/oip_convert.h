// The Open Inference Protocol (KServe v2) front-end's one translation: an
// inference.ModelInferRequest becomes the normd.v1 NormalizeRequest or
// FitRequest it stands for, and the native reply becomes the
// ModelInferResponse. No numerics and no state here: the native service runs
// the translated request through convert.h, the one place where protos
// become core types, so both APIs give the same bytes and the same errors.
// Problems only OIP can have (datatype strings, parameters, input names,
// mixed content forms) get INVALID_ARGUMENT naming the OIP field. Stateless;
// thread-safe.
#ifndef NORMD_SERVER_RPC_OIP_CONVERT_H_
#define NORMD_SERVER_RPC_OIP_CONVERT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "inference/grpc_predict_v2.pb.h"
#include "normd/v1/normalizer.pb.h"

namespace normd {

// The one version every OIP model has.
inline constexpr char kOipModelVersion[] = "1";

// The stateless mode a built-in OIP model name runs ("layer_norm",
// "rms_norm", "group_norm", "instance_norm", "l2_norm", "weight_norm");
// nullopt for any other name,
// which stands for a BatchNorm model of the store.
std::optional<v1::Mode> BuiltinOipModel(absl::string_view name);

// The native dtype of an OIP datatype string ("FP32", "FP64", "FP16",
// "BF16"); nullopt for any other.
std::optional<v1::DataType> OipDatatype(absl::string_view name);

// NOT_FOUND naming `field` unless `version` is "" or "1".
absl::Status CheckOipVersion(absl::string_view version, absl::string_view model,
                             absl::string_view field);

// A ModelInferRequest as a native call.
struct NativeInferCall {
  bool fit = false;                // Fit (the parameter fit), else Normalize.
  v1::NormalizeRequest normalize;  // When !fit.
  v1::FitRequest fit_request;      // When fit.
  bool raw = false;                // Raw contents in, raw contents out.
  std::string datatype;            // The input's OIP datatype.
  bool batch_norm = false;         // A store model: counters in the reply.

  // As default-constructed, keeping the messages' memory for reuse.
  void Clear();
};

// Translates `request` into `call`. The raw contents are moved out of
// `request` (no copy of the tensors). INVALID_ARGUMENT naming the OIP field
// for anything OIP-specific that is wrong; NOT_FOUND for a model version
// other than "1" (after every INVALID_ARGUMENT). What the native API checks
// itself (shapes, lengths, values, model names) it reports itself.
absl::Status ToNativeInfer(inference::ModelInferRequest& request,
                           NativeInferCall& call);

// The ModelInferResponse of a native Normalize reply (moved from, no copy of
// the output) for `request`, translated by `call`.
void FromNativeNormalize(const inference::ModelInferRequest& request,
                         const NativeInferCall& call,
                         v1::NormalizeResponse& reply,
                         inference::ModelInferResponse& response);

// FromNativeNormalize without the output's elements, for an output of
// `output_meta`'s dtype and shape written in place: then serialized, followed
// by the key of one raw_output_contents entry of `payload_bytes` (the bytes
// themselves follow it on the wire).
std::string OipRawResponseHead(const inference::ModelInferRequest& request,
                               const NativeInferCall& call,
                               const v1::Tensor& output_meta,
                               int64_t payload_bytes,
                               const v1::NormalizeResponse& reply);

// The field number of ModelInferRequest.raw_input_contents.
inline constexpr uint32_t kRawInputContentsField = 7;

// The ModelInferResponse of a native Fit reply: no outputs, the counters.
void FromNativeFit(const inference::ModelInferRequest& request,
                   const v1::FitResponse& reply,
                   inference::ModelInferResponse& response);

// ModelMetadata of a built-in model (num_features unset) or of a BatchNorm
// model of `num_features` channels.
void OipModelMetadata(absl::string_view name,
                      std::optional<int64_t> num_features,
                      inference::ModelMetadataResponse& response);

}  // namespace normd

#endif  // NORMD_SERVER_RPC_OIP_CONVERT_H_

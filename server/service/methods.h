// The calls normd serves, as the call lifecycle and the metrics name them:
// the front end a call came through (Protocol) and what it asked for
// (Method). Every method of every front end is one Method; the same Method
// through two front ends (ModelInfer over gRPC and over REST) is one service
// call. Constants only; thread-safe.
#ifndef NORMD_SERVER_SERVICE_METHODS_H_
#define NORMD_SERVER_SERVICE_METHODS_H_

namespace normd {

// The front ends, as the `protocol` label of the metrics.
enum class Protocol {
  kGrpc,     // normd.v1.Normalizer
  kOipGrpc,  // inference.GRPCInferenceService
  kRest,     // the Open Inference Protocol over HTTP/REST
};
inline constexpr int kNumProtocols = 3;

// "grpc", "oip_grpc", "rest".
const char* ProtocolName(Protocol protocol);

enum class Method {
  // normd.v1.Normalizer.
  kNormalize,
  kFit,
  kCreateModel,
  kGetModel,
  kListModels,
  kDeleteModel,
  kResetModel,
  kNormalizeStream,
  kFitStream,
  kExportModel,
  kImportModel,
  kMergeModel,
  kCreateModels,
  kSetReference,
  kClearReference,
  // The Open Inference Protocol (gRPC and REST).
  kServerLive,
  kServerReady,
  kModelReady,
  kServerMetadata,
  kModelMetadata,
  kModelInfer,
  // Triton's extensions, on REST only.
  kRepositoryIndex,
  kModelConfig,
  kModelStatistics,
};
inline constexpr int kNumMethods = 24;

// The method's name as its protocol spells it ("Normalize", "ModelInfer",
// "RepositoryIndex", ...).
const char* MethodName(Method method);

// Whether `protocol` serves `method` (the metrics export only those series).
bool Serves(Protocol protocol, Method method);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_METHODS_H_

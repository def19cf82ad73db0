#include "server/service/methods.h"

namespace normd {
namespace {

constexpr const char* kMethodNames[kNumMethods] = {
    "Normalize",      "Fit",
    "CreateModel",    "GetModel",
    "ListModels",     "DeleteModel",
    "ResetModel",     "NormalizeStream",
    "FitStream",      "ExportModel",
    "ImportModel",    "MergeModel",
    "CreateModels",   "SetReference",
    "ClearReference", "ServerLive",
    "ServerReady",    "ModelReady",
    "ServerMetadata", "ModelMetadata",
    "ModelInfer",     "RepositoryIndex",
    "ModelConfig",    "ModelStatistics"};

}  // namespace

const char* ProtocolName(Protocol protocol) {
  switch (protocol) {
    case Protocol::kGrpc:
      return "grpc";
    case Protocol::kOipGrpc:
      return "oip_grpc";
    case Protocol::kRest:
      break;
  }
  return "rest";
}

const char* MethodName(Method method) {
  return kMethodNames[static_cast<int>(method)];
}

bool Serves(Protocol protocol, Method method) {
  const int m = static_cast<int>(method);
  switch (protocol) {
    case Protocol::kGrpc:
      return m <= static_cast<int>(Method::kClearReference);
    case Protocol::kOipGrpc:
      return m >= static_cast<int>(Method::kServerLive) &&
             m <= static_cast<int>(Method::kModelInfer);
    case Protocol::kRest:
      return m >= static_cast<int>(Method::kServerLive);
  }
  return false;
}

}  // namespace normd

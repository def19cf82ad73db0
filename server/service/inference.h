// The Open Inference Protocol (KServe v2) on the service, protocol-free:
// the server's liveness, readiness and metadata, each model's metadata,
// readiness, configuration and statistics, the repository index, and infer,
// which runs the native Normalize or Fit an infer request stands for
// (infer_translation.h) through the Service, with its checks, limits and
// metrics. The gRPC service and the REST front end translate their messages
// into these calls and nothing else.
//
// Thread-safe: any number of calls at once.
#ifndef NORMD_SERVER_SERVICE_INFERENCE_H_
#define NORMD_SERVER_SERVICE_INFERENCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/drift_measures.h"
#include "server/service/infer_request.h"
#include "server/service/model_statistics.h"
#include "server/service/oip_models.h"
#include "server/service/readiness.h"
#include "server/service/service.h"

namespace normd {

struct OipServerMetadata {
  std::string name;
  std::string version;
  std::vector<std::string> extensions;
};

// One model of the repository index (Triton's repository extension).
struct OipRepositoryEntry {
  std::string name;
  std::string version;
  std::string state;  // "READY".
};

// A model's configuration (Triton's model configuration extension).
struct OipModelConfig {
  std::string name;
  std::string platform;
  std::vector<OipTensorMetadata> inputs;
  std::vector<OipTensorMetadata> outputs;
  // A BatchNorm model's num_features, eps and momentum, as decimal text;
  // none for the built-in models.
  std::vector<std::pair<std::string, std::string>> parameters;
};

// A model's statistics (Triton's statistics extension).
struct OipModelStatistics {
  std::string name;
  std::string version;
  InferStatistics infer;
  // A BatchNorm model's drift, when it has a reference.
  std::optional<DriftReport> drift;
};

// Where the front end has an infer call's output written, and how large its
// reply will be in its encoding (see ReplySize).
struct OutputPlacement {
  void* data = nullptr;
  ReplySize reply;
};

class Inference {
 public:
  // `service` and `readiness` must outlive it.
  Inference(Service& service, const Readiness& readiness,
            std::string server_version);

  bool Ready() const { return readiness_.ready(); }
  OipServerMetadata ServerMetadata() const;

  // A malformed name is INVALID_ARGUMENT, an unknown one NOT_FOUND, then a
  // version other than "" and "1" NOT_FOUND naming `version`.
  absl::StatusOr<OipModelMetadata> ModelMetadata(absl::string_view name,
                                                 absl::string_view version);
  absl::StatusOr<OipModelConfig> ModelConfig(absl::string_view name,
                                             absl::string_view version);
  // Whether the model exists and has that version.
  bool ModelReady(absl::string_view name, absl::string_view version) const;
  // The built-in models and every BatchNorm model, all READY.
  std::vector<OipRepositoryEntry> RepositoryIndex() const;
  // Every model's statistics, or model `name`'s (errors as ModelMetadata).
  absl::StatusOr<std::vector<OipModelStatistics>> Statistics(
      std::optional<absl::string_view> name, absl::string_view version);

  // Translates and runs `request`. `place` is told the output the call will
  // produce (before anything changes) and says where to write it; an error
  // it returns ends the call. A BatchNorm model's reply carries its
  // counters. Recorded in the model's statistics when the model exists.
  using PlaceOutput = absl::FunctionRef<absl::StatusOr<OutputPlacement>(
      const InferOutputPlan&)>;
  absl::StatusOr<InferReply> Infer(const InferRequest& request,
                                   PlaceOutput place);

 private:
  // The BatchNorm model `name` (nullopt: a built-in one), or its error.
  absl::StatusOr<std::optional<BatchNormModel>> FindModel(
      absl::string_view name, absl::string_view version) const;
  bool Exists(absl::string_view name) const;
  absl::StatusOr<InferReply> RunInfer(const InferRequest& request,
                                      PlaceOutput place);

  Service& service_;
  const Readiness& readiness_;
  const std::string server_version_;
  ModelStatistics statistics_;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_INFERENCE_H_

// normd's protocol-free API: Normalize, Fit and the model calls on the
// core's types, and what every call shares whatever its front end: the
// server's token, admission, metrics and reply budget (see call.h for one
// call's lifecycle). Front ends (server/rpc for gRPC, server/http for REST)
// translate their messages into these calls and their statuses through
// status_mapping.h; they never talk to the Engine or the ModelStore directly.
// The Open Inference Protocol's models are inference.h, on top of this.
//
// Thread-safe: any number of calls at once (the Engine and the metrics are
// thread-safe).
#ifndef NORMD_SERVER_SERVICE_SERVICE_H_
#define NORMD_SERVER_SERVICE_SERVICE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/engine.h"
#include "server/core/model.h"
#include "server/service/admission.h"
#include "server/service/service_metrics.h"

namespace normd {

struct ServiceOptions {
  // The bearer token every call but health must carry; empty: none needed.
  std::string auth_token;
  // The largest reply the server sends (--max_message_bytes): a call whose
  // reply would be larger is refused before it changes anything.
  int64_t max_message_bytes = 64 << 20;
};

// How large a call's reply will be in its front end's encoding, so that a
// call whose reply could not be sent is refused before it changes anything.
struct ReplySize {
  // Everything but the model the reply carries.
  int64_t bytes = 0;
  // The reply carries the model after the call with its per-channel arrays
  // (the native API's ModelState; about 48 bytes per channel).
  bool with_model_arrays = true;
};

class Service {
 public:
  // All references must outlive the service.
  Service(Engine& engine, ServiceMetrics& metrics, Admission& admission,
          ServiceOptions options);

  // Normalizes spec.input into `output` (spec.input.size elements of its
  // dtype). Returns the model after the call for BatchNorm and InstanceNorm
  // with a model, else nullopt. RESOURCE_EXHAUSTED, before anything changes,
  // when `reply` would pass --max_message_bytes.
  absl::StatusOr<std::optional<BatchNormModel>> Normalize(
      const NormalizeSpec& spec, void* output, const ReplySize& reply);
  // One training step; the model after it. Reply budget as Normalize.
  absl::StatusOr<BatchNormModel> Fit(const FitSpec& spec,
                                     const ReplySize& reply);

  // The model calls (see normalizer.proto). Names are validated by the
  // store; every reply carries the model's arrays but CreateModels' and
  // ListModels'.
  absl::StatusOr<BatchNormModel> CreateModel(const ModelSpec& spec);
  // CreateModels routed by a group (`routed_group`, the routing header)
  // creates only models of that group (model_group.h).
  absl::StatusOr<std::vector<BatchNormModel>> CreateModels(
      absl::Span<const ModelSpec> specs,
      const std::optional<std::string>& routed_group = std::nullopt);
  absl::StatusOr<BatchNormModel> GetModel(absl::string_view name) const;
  // Every model, or with `group` only that group's (INVALID_ARGUMENT if it
  // is not a group).
  absl::StatusOr<std::vector<BatchNormModel>> ListModels(
      absl::string_view group) const;
  std::vector<BatchNormModel> ListModels() const;
  absl::Status DeleteModel(absl::string_view name);
  absl::StatusOr<BatchNormModel> ResetModel(absl::string_view name);
  // Stores a received model state (named `name` when that is not empty),
  // replacing the model of that name unless `create_only`.
  absl::StatusOr<BatchNormModel> ImportModel(ModelStateSpec state,
                                             absl::string_view name,
                                             bool create_only);
  // Folds the received `source` into model `name`.
  absl::StatusOr<BatchNormModel> MergeModel(absl::string_view name,
                                            ModelStateSpec source);

  // Sets / removes model `name`'s drift reference (ModelStore).
  absl::StatusOr<BatchNormModel> SetReference(absl::string_view name,
                                              const ReferenceRequest& request);
  absl::StatusOr<BatchNormModel> ClearReference(absl::string_view name);
  // `model`'s drift over the observation window; nullopt without a
  // reference. ResetModel empties the window, DeleteModel drops it, and an
  // ImportModel that replaces a model empties it.
  std::optional<DriftReport> Drift(const BatchNormModel& model) const;

  // Whether `name` is a model of the store (a malformed name is not).
  bool HasModel(absl::string_view name) const;

  const ServiceOptions& options() const { return options_; }
  ServiceMetrics& metrics() { return metrics_; }
  Admission& admission() { return admission_; }
  ModelStore& store() { return engine_.store(); }
  const ModelStore& store() const { return engine_.store(); }

 private:
  // RESOURCE_EXHAUSTED unless a reply of `bytes` fits --max_message_bytes.
  absl::Status CheckReplySize(int64_t bytes, absl::string_view what) const;
  // CheckReplySize for `reply` with the model of `channels` channels named
  // `name`.
  absl::Status CheckModelReplySize(int64_t channels, absl::string_view name,
                                   const ReplySize& reply) const;
  // A received model state, named `name` when that is not empty, validated
  // (errors name the field after `field`.), within the channel limit and the
  // reply budget.
  absl::StatusOr<BatchNormModel> MakeReceivedModel(const ModelStateSpec& state,
                                                   absl::string_view name,
                                                   absl::string_view field);
  // Sets the models gauges from the store.
  void UpdateModelMetrics();

  Engine& engine_;
  ServiceMetrics& metrics_;
  Admission& admission_;
  const ServiceOptions options_;
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_SERVICE_H_

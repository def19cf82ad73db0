// normd C++ client: a thin, typed wrapper over the normd.v1.Normalizer stub
// that returns absl::StatusOr, applies a per-call deadline, and sends the
// routing headers `x-normd-model` (the request's model name; absent for
// LAYER_NORM) and `x-normd-group` (its group, the name up to the first '.')
// so that an HTTP/2 proxy can keep a model's group on one replica.
//
// Thread-safe: one NormdClient may be shared by any number of threads (gRPC
// stubs and channels are thread-safe).
#ifndef NORMD_CLIENT_CLIENT_H_
#define NORMD_CLIENT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "normd/v1/normalizer.grpc.pb.h"

namespace normd::client {

// The metadata keys that carry the model name and its group.
inline constexpr char kModelHeader[] = "x-normd-model";
inline constexpr char kGroupHeader[] = "x-normd-group";

// A model's group: its name up to the first '.' (the whole name if none).
// A sharding proxy hashes it, so that a checkpoint's models P.<layer> stay
// on one replica.
inline absl::string_view ModelGroupOf(absl::string_view name) {
  return name.substr(0, name.find('.'));
}

struct ClientOptions {
  absl::Duration timeout = absl::Seconds(30);  // Per call.
  int max_message_bytes = 64 << 20;
  // Channel credentials (e.g. grpc::SslCredentials for TLS / mTLS); null:
  // plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // Sent as "authorization: Bearer <token>" on every call when not empty
  // (normd's --auth_token_file).
  std::string bearer_token;
};

class NormdClient {
 public:
  // A client on a channel to `target` ("host:port") with the options'
  // credentials (plaintext by default).
  static std::unique_ptr<NormdClient> Connect(const std::string& target,
                                              ClientOptions options = {});
  NormdClient(std::shared_ptr<grpc::Channel> channel, ClientOptions options);

  absl::StatusOr<v1::NormalizeResponse> Normalize(
      const v1::NormalizeRequest& request);
  absl::StatusOr<v1::FitResponse> Fit(const v1::FitRequest& request);
  absl::StatusOr<v1::ModelState> CreateModel(
      const v1::CreateModelRequest& request);
  // Creates every model of the request or none. Routed by the group the
  // names share; names of several groups are sent without the group
  // header, which a sharding proxy refuses (INVALID_ARGUMENT).
  absl::StatusOr<v1::CreateModelsResponse> CreateModels(
      const v1::CreateModelsRequest& request);
  absl::StatusOr<v1::ModelState> GetModel(absl::string_view name);
  // Every model, or with `group` that group's, routed to its replica.
  absl::StatusOr<v1::ListModelsResponse> ListModels(
      absl::string_view group = "");
  absl::Status DeleteModel(absl::string_view name);
  absl::StatusOr<v1::ModelState> ResetModel(absl::string_view name);
  // A model's complete state (with pooled_m2), for ImportModel / MergeModel.
  absl::StatusOr<v1::ModelState> ExportModel(absl::string_view name);
  // Creates or replaces a model from an exported state (the header carries
  // the name it is imported under).
  absl::StatusOr<v1::ModelState> ImportModel(
      const v1::ImportModelRequest& request);
  // Folds an exported state into model `name`.
  absl::StatusOr<v1::ModelState> MergeModel(absl::string_view name,
                                            const v1::ModelState& source);

  // Sets model request.model()'s drift reference; removes model `name`'s.
  absl::StatusOr<v1::ModelState> SetReference(
      const v1::SetReferenceRequest& request);
  absl::StatusOr<v1::ModelState> ClearReference(absl::string_view name);

  // Sends every request on one NormalizeStream and returns the responses in
  // order (per-request failures are in each response's `error`).
  absl::StatusOr<std::vector<v1::NormalizeResponse>> NormalizeStream(
      const std::vector<v1::NormalizeRequest>& requests);
  // Sends every request on one FitStream; the model after the last step.
  absl::StatusOr<v1::FitResponse> FitStream(
      const std::vector<v1::FitRequest>& requests);
  // One FitStream for `model` whose steps `next` produces one at a time
  // (for inputs larger than memory): `next` fills the request and returns
  // true, false after the last step, or an error, which cancels the stream
  // and is returned. `deadline` bounds the whole stream.
  absl::StatusOr<v1::FitResponse> FitStream(
      absl::string_view model, absl::Duration deadline,
      const std::function<absl::StatusOr<bool>(v1::FitRequest&)>& next);

  // Waits until the channel is connected. UNAVAILABLE as soon as an attempt
  // fails (connection refused, name not resolved, TLS handshake refused):
  // nobody is there to wait for. UNAVAILABLE too if a server that does not
  // answer at all (a dropped SYN) is not connected within `timeout`.
  absl::Status WaitForConnection(absl::Duration timeout);

  // grpc.health.v1 Check: SERVING, NOT_SERVING, ... ("" = whole server).
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> Health(
      absl::string_view service = "");

 private:
  // A context with the deadline and, if `model` is not empty, the routing
  // headers: the model and its group.
  void Prepare(grpc::ClientContext& context, absl::string_view model) const;
  // The deadline and the group header alone (CreateModels, ListModels).
  void PrepareGroup(grpc::ClientContext& context,
                    absl::string_view group) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Normalizer::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
};

}  // namespace normd::client

#endif  // NORMD_CLIENT_CLIENT_H_

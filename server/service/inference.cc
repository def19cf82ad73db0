#include "server/service/inference.h"

#include <charconv>
#include <chrono>
#include <limits>

#include "absl/strings/str_cat.h"
#include "server/service/infer_translation.h"

namespace normd {
namespace {

// The shortest decimal text that reads back as `value`.
std::string Text(double value) {
  char buffer[32];
  const std::to_chars_result end =
      std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, end.ptr);
}

}  // namespace

Inference::Inference(Service& service, const Readiness& readiness,
                     std::string server_version)
    : service_(service),
      readiness_(readiness),
      server_version_(std::move(server_version)) {}

OipServerMetadata Inference::ServerMetadata() const {
  // Triton's binary-data, repository, configuration and statistics
  // extensions (REST).
  return {.name = "normd",
          .version = server_version_,
          .extensions = {"binary_tensor_data", "model_repository",
                         "model_configuration", "statistics"}};
}

bool Inference::Exists(absl::string_view name) const {
  return BuiltinOipModel(name).has_value() || service_.HasModel(name);
}

absl::StatusOr<std::optional<BatchNormModel>> Inference::FindModel(
    absl::string_view name, absl::string_view version) const {
  std::optional<BatchNormModel> model;
  if (!BuiltinOipModel(name).has_value()) {
    absl::StatusOr<BatchNormModel> found = service_.GetModel(name);
    if (!found.ok()) return found.status();
    model = *std::move(found);
  }
  if (absl::Status s = CheckOipVersion(version, name, "version"); !s.ok()) {
    return s;
  }
  return model;
}

absl::StatusOr<OipModelMetadata> Inference::ModelMetadata(
    absl::string_view name, absl::string_view version) {
  absl::StatusOr<std::optional<BatchNormModel>> model =
      FindModel(name, version);
  if (!model.ok()) return model.status();
  return MetadataOf(name, model->has_value() ? &**model : nullptr);
}

absl::StatusOr<OipModelConfig> Inference::ModelConfig(
    absl::string_view name, absl::string_view version) {
  absl::StatusOr<std::optional<BatchNormModel>> model =
      FindModel(name, version);
  if (!model.ok()) return model.status();
  OipModelMetadata metadata =
      MetadataOf(name, model->has_value() ? &**model : nullptr);
  OipModelConfig config{.name = std::move(metadata.name),
                        .platform = std::move(metadata.platform),
                        .inputs = std::move(metadata.inputs),
                        .outputs = std::move(metadata.outputs),
                        .parameters = {}};
  if (model->has_value()) {
    const BatchNormModel& m = **model;
    config.parameters = {
        {"num_features", absl::StrCat(m.num_features)},
        {"eps", Text(m.eps)},
        {"momentum",
         m.cumulative_average ? std::string("cumulative") : Text(m.momentum)},
        {"use_pooled_statistics", m.use_pooled_statistics ? "true" : "false"}};
  }
  return config;
}

bool Inference::ModelReady(absl::string_view name,
                           absl::string_view version) const {
  return CheckOipVersion(version, name, "version").ok() && Exists(name);
}

std::vector<OipRepositoryEntry> Inference::RepositoryIndex() const {
  std::vector<OipRepositoryEntry> index;
  for (std::string& name : BuiltinOipModelNames()) {
    index.push_back({std::move(name), kOipModelVersion, "READY"});
  }
  for (BatchNormModel& model : service_.ListModels()) {
    index.push_back({std::move(model.name), kOipModelVersion, "READY"});
  }
  return index;
}

absl::StatusOr<std::vector<OipModelStatistics>> Inference::Statistics(
    std::optional<absl::string_view> name, absl::string_view version) {
  std::vector<OipModelStatistics> all;
  if (name.has_value()) {
    absl::StatusOr<std::optional<BatchNormModel>> model =
        FindModel(*name, version);
    if (!model.ok()) return model.status();
    all.push_back(
        {std::string(*name), kOipModelVersion, statistics_.Get(*name),
         model->has_value() ? service_.Drift(**model) : std::nullopt});
    return all;
  }
  for (std::string& builtin : BuiltinOipModelNames()) {
    InferStatistics infer = statistics_.Get(builtin);
    all.push_back({std::move(builtin), kOipModelVersion, infer, std::nullopt});
  }
  for (const BatchNormModel& model : service_.ListModels()) {
    all.push_back({model.name, kOipModelVersion, statistics_.Get(model.name),
                   service_.Drift(model)});
  }
  return all;
}

absl::StatusOr<InferReply> Inference::RunInfer(const InferRequest& request,
                                               PlaceOutput place) {
  NativeInfer call;
  if (absl::Status s = TranslateInfer(request, call); !s.ok()) return s;
  absl::StatusOr<OutputPlacement> placement = place(call.output);
  if (!placement.ok()) return placement.status();
  InferReply reply{.output = std::move(call.output), .counters = std::nullopt};
  const auto counters = [](const BatchNormModel& model) {
    return ModelCounters{.num_batches_tracked = model.num_batches_tracked,
                         .generation = model.generation};
  };
  if (call.fit) {
    absl::StatusOr<BatchNormModel> model =
        service_.Fit(call.fit_spec, placement->reply);
    if (!model.ok()) return model.status();
    reply.counters = counters(*model);
    return reply;
  }
  absl::StatusOr<std::optional<BatchNormModel>> model =
      service_.Normalize(call.normalize, placement->data, placement->reply);
  if (!model.ok()) return model.status();
  if (call.batch_norm && model->has_value()) reply.counters = counters(**model);
  return reply;
}

absl::StatusOr<InferReply> Inference::Infer(const InferRequest& request,
                                            PlaceOutput place) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<InferReply> reply = RunInfer(request, place);
  if (Exists(request.model_name)) {
    const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    // Room for every model the store may hold, and as many deleted ones.
    const int64_t bound = 2 * (service_.store().size() + 1024);
    statistics_.Record(request.model_name, reply.ok(), ns, bound,
                       [this](absl::string_view name) { return Exists(name); });
  }
  return reply;
}

}  // namespace normd

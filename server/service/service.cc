#include "server/service/service.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/layout.h"
#include "server/service/buffer_pool.h"
#include "server/service/model_group.h"

namespace normd {
namespace {

// The normd_elements_total label of a Normalize call.
ElementsMode ElementsModeOf(const NormalizeSpec& spec) {
  switch (spec.mode) {
    case NormMode::kBatchNorm:
      return spec.training ? ElementsMode::kBatchNormTrain
                           : ElementsMode::kBatchNormEval;
    case NormMode::kGroupNorm:
      return ElementsMode::kGroupNorm;
    case NormMode::kInstanceNorm:
      return ElementsMode::kInstanceNorm;
    case NormMode::kRmsNorm:
      return ElementsMode::kRmsNorm;
    case NormMode::kL2Norm:
      return ElementsMode::kL2Norm;
    case NormMode::kWeightNorm:
      return ElementsMode::kWeightNorm;
    case NormMode::kLayerNorm:
      break;
  }
  return ElementsMode::kLayerNorm;
}

}  // namespace

Service::Service(Engine& engine, ServiceMetrics& metrics, Admission& admission,
                 ServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      admission_(admission),
      options_(std::move(options)) {}

absl::Status Service::CheckReplySize(int64_t bytes,
                                     absl::string_view what) const {
  if (bytes <= options_.max_message_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "response: ", what, " would take about ", bytes,
      " bytes, more than the server sends in one message (--max_message_bytes "
      "= ",
      options_.max_message_bytes, "); refused before anything was changed"));
}

absl::Status Service::CheckModelReplySize(int64_t channels,
                                          absl::string_view name,
                                          const ReplySize& reply) const {
  // A model with its arrays: six arrays of doubles (running_mean / var,
  // mean, var, weight, bias; each with at most 6 bytes of framing), the name
  // and at most 96 bytes of scalars, 30 of the drift reference's source and
  // time, plus 6 bytes of its own framing; without them, the scalars. (Only
  // GetModel, ExportModel and SetReference carry the reference's arrays.)
  // Counted in double, so that any channel count a shape can claim is sized
  // without overflow; past the int64 range the reply is simply too large.
  const double model_bytes =
      reply.with_model_arrays
          ? 6.0 * (6.0 + 8.0 * static_cast<double>(channels)) +
                static_cast<double>(name.size()) + 132.0
          : static_cast<double>(name.size()) + 132.0;
  const double estimate = model_bytes + static_cast<double>(reply.bytes);
  const int64_t bytes = estimate < 9e18 ? static_cast<int64_t>(estimate)
                                        : std::numeric_limits<int64_t>::max();
  return CheckReplySize(bytes, absl::StrCat("the reply with the model of ",
                                            channels, " channels"));
}

void Service::UpdateModelMetrics() {
  metrics_.SetModels(store().size(), store().model_bytes());
}

absl::StatusOr<std::optional<BatchNormModel>> Service::Normalize(
    const NormalizeSpec& spec, void* output, const ReplySize& reply) {
  if (const std::optional<int64_t> channels =
          Engine::ReturnedModelChannels(spec)) {
    if (absl::Status s = CheckModelReplySize(*channels, spec.model, reply);
        !s.ok()) {
      return s;
    }
  }
  // Scattered input the kernels cannot read piece by piece is gathered
  // into a pooled buffer (the engine would take a fresh one).
  PooledBuffer gathered(nullptr, &BufferPool::Release);
  NormalizeSpec gathered_spec;
  const NormalizeSpec* run = &spec;
  if (spec.input.scattered != nullptr && !Engine::ReadsScatteredInPlace(spec)) {
    const ScatteredBytes& pieces = *spec.input.scattered;
    gathered = AcquirePooled(static_cast<size_t>(pieces.size()));
    pieces.CopyOut(0, pieces.size(), gathered.get());
    gathered_spec = spec;
    gathered_spec.input.scattered = nullptr;
    gathered_spec.input.data = gathered.get();
    run = &gathered_spec;
  }
  absl::StatusOr<std::optional<BatchNormModel>> model =
      engine_.Normalize(*run, output);
  if (!model.ok()) return model.status();
  if (model->has_value() && spec.training) UpdateModelMetrics();
  metrics_.AddElements(ElementsModeOf(spec), spec.input.size);
  return model;
}

absl::StatusOr<BatchNormModel> Service::Fit(const FitSpec& spec,
                                            const ReplySize& reply) {
  if (absl::StatusOr<ChannelLayout> layout =
          ResolveChannelAxis(spec.input.shape, spec.channel_axis);
      layout.ok()) {
    if (absl::Status s =
            CheckModelReplySize(layout->channels, spec.model, reply);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<BatchNormModel> model = engine_.Fit(spec);
  if (!model.ok()) return model.status();
  metrics_.AddElements(ElementsMode::kFit, spec.input.size);
  UpdateModelMetrics();
  return model;
}

absl::StatusOr<BatchNormModel> Service::CreateModel(const ModelSpec& spec) {
  // A malformed request is INVALID_ARGUMENT before any limit is reported.
  if (absl::Status s = ValidateModelSpec(spec); !s.ok()) return s;
  if (absl::Status s =
          store().CheckNumFeatures(spec.num_features, "num_features");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckModelReplySize(spec.num_features, spec.name, ReplySize{});
      !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = store().Create(spec);
  if (model.ok()) UpdateModelMetrics();
  return model;
}

absl::StatusOr<std::vector<BatchNormModel>> Service::CreateModels(
    absl::Span<const ModelSpec> specs,
    const std::optional<std::string>& routed_group) {
  if (absl::Status s = CheckRoutedGroup(specs, routed_group); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::vector<BatchNormModel>> models = store().CreateAll(specs);
  if (models.ok()) UpdateModelMetrics();
  return models;
}

absl::StatusOr<BatchNormModel> Service::GetModel(absl::string_view name) const {
  return store().Get(name);
}

std::vector<BatchNormModel> Service::ListModels() const {
  return store().List();
}

absl::StatusOr<std::vector<BatchNormModel>> Service::ListModels(
    absl::string_view group) const {
  if (group.empty()) return store().List();
  if (absl::Status s = ValidateGroup(group, "group"); !s.ok()) return s;
  std::vector<BatchNormModel> models = store().List();
  std::erase_if(models, [group](const BatchNormModel& model) {
    return ModelGroup(model.name) != group;
  });
  return models;
}

bool Service::HasModel(absl::string_view name) const {
  return store().Get(name).ok();
}

absl::Status Service::DeleteModel(absl::string_view name) {
  absl::Status status = store().Delete(name);
  if (status.ok()) {
    engine_.drift_monitor().Forget(name);
    UpdateModelMetrics();
  }
  return status;
}

absl::StatusOr<BatchNormModel> Service::ResetModel(absl::string_view name) {
  absl::StatusOr<BatchNormModel> model = store().Reset(name);
  if (model.ok()) engine_.drift_monitor().Clear(name);
  return model;
}

absl::StatusOr<BatchNormModel> Service::SetReference(
    absl::string_view name, const ReferenceRequest& request) {
  absl::StatusOr<BatchNormModel> model = store().SetReference(name, request);
  // A reference is charged to the model budget.
  if (model.ok()) UpdateModelMetrics();
  return model;
}

absl::StatusOr<BatchNormModel> Service::ClearReference(absl::string_view name) {
  absl::StatusOr<BatchNormModel> model = store().ClearReference(name);
  if (model.ok()) {
    // Without a reference nothing is observed: the window goes, with its
    // charge.
    engine_.drift_monitor().Forget(name);
    UpdateModelMetrics();
  }
  return model;
}

std::optional<DriftReport> Service::Drift(const BatchNormModel& model) const {
  return engine_.Drift(model);
}

absl::StatusOr<BatchNormModel> Service::MakeReceivedModel(
    const ModelStateSpec& received, absl::string_view name,
    absl::string_view field) {
  ModelStateSpec state = received;
  if (!name.empty()) state.config.name = std::string(name);
  if (absl::Status s = ValidateModelState(state, absl::StrCat(field, "."));
      !s.ok()) {
    return s;
  }
  // Before MakeModelFromState fills num_features-sized arrays.
  if (absl::Status s = store().CheckNumFeatures(
          state.config.num_features, absl::StrCat(field, ".num_features"));
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckModelReplySize(state.config.num_features,
                                           state.config.name, ReplySize{});
      !s.ok()) {
    return s;
  }
  return MakeModelFromState(state, absl::StrCat(field, "."));
}

absl::StatusOr<BatchNormModel> Service::ImportModel(ModelStateSpec state,
                                                    absl::string_view name,
                                                    bool create_only) {
  if (!name.empty()) {
    if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  }
  absl::StatusOr<BatchNormModel> model =
      MakeReceivedModel(state, name, "model");
  if (!model.ok()) return model.status();
  model = store().Put(*std::move(model), create_only);
  if (model.ok()) {
    // A replaced model's inputs were another model's.
    engine_.drift_monitor().Clear(model->name);
    UpdateModelMetrics();
  }
  return model;
}

absl::StatusOr<BatchNormModel> Service::MergeModel(absl::string_view name,
                                                   ModelStateSpec source) {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  // The source's own name does not matter: it is validated as the target's.
  absl::StatusOr<BatchNormModel> model =
      MakeReceivedModel(source, name, "source");
  if (!model.ok()) return model.status();
  return store().Merge(name, *model);
}

}  // namespace normd

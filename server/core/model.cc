#include "server/core/model.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace normd {
namespace {

constexpr size_t kMaxNameLength = 128;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
         c == '/' || c == '-';
}

// INVALID_ARGUMENT naming `field` unless `values` is empty or has `channels`
// finite entries (>= 0 when `non_negative`).
absl::Status CheckChannelArray(const std::vector<double>& values,
                               int64_t channels, absl::string_view field,
                               bool non_negative = false) {
  if (values.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(values.size()) != channels) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": has ", values.size(),
                     " values, expected num_features = ", channels, " or 0"));
  }
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || (non_negative && values[i] < 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, "[", i, "]: ", values[i], " is not ",
                       non_negative ? "finite and >= 0" : "finite"));
    }
  }
  return absl::OkStatus();
}

// `values`, or `fill` for every channel when empty.
std::vector<double> ChannelArray(const std::vector<double>& values,
                                 int64_t channels, double fill) {
  return values.empty() ? std::vector<double>(channels, fill) : values;
}

}  // namespace

std::vector<double> BatchNormModel::PooledMean() const {
  std::vector<double> out;
  out.reserve(pooled.size());
  for (const Moments& m : pooled) out.push_back(m.mean);
  return out;
}

std::vector<double> BatchNormModel::PooledVariance() const {
  std::vector<double> out;
  out.reserve(pooled.size());
  for (const Moments& m : pooled) out.push_back(m.BiasedVariance());
  return out;
}

absl::Status ValidateModelName(absl::string_view name,
                               absl::string_view field) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be 1-", kMaxNameLength,
        " characters of [A-Za-z0-9._:/-], got ", name.size(), " characters"));
  }
  for (char c : name) {
    if (!IsNameChar(c)) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": character '", std::string(1, c),
                       "' is not allowed; use [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEps(double eps, absl::string_view field) {
  if (!std::isfinite(eps) || eps <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": must be finite and > 0, got ", eps));
  }
  return absl::OkStatus();
}

absl::Status ValidateModelSpec(const ModelSpec& spec) {
  if (absl::Status s = ValidateModelName(spec.name, "name"); !s.ok()) return s;
  if (spec.num_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_features: must be >= 1, got ", spec.num_features));
  }
  const double momentum = spec.momentum.value_or(kDefaultMomentum);
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum: must be in [0, 1], got ", momentum));
  }
  if (absl::Status s = ValidateEps(spec.eps.value_or(kDefaultEps), "eps");
      !s.ok()) {
    return s;
  }
  if (spec.num_batches_tracked < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_batches_tracked: must be >= 0, got ", spec.num_batches_tracked));
  }
  const int64_t c = spec.num_features;
  for (const auto& [values, field, non_negative] :
       {std::tuple{&spec.running_mean, "running_mean", false},
        std::tuple{&spec.running_var, "running_var", true},
        std::tuple{&spec.weight, "weight", false},
        std::tuple{&spec.bias, "bias", false}}) {
    if (absl::Status s = CheckChannelArray(*values, c, field, non_negative);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<BatchNormModel> MakeModel(const ModelSpec& spec) {
  if (absl::Status s = ValidateModelSpec(spec); !s.ok()) return s;
  const int64_t c = spec.num_features;
  BatchNormModel model;
  model.name = spec.name;
  model.num_features = c;
  model.momentum = spec.momentum.value_or(kDefaultMomentum);
  model.cumulative_average = spec.cumulative_average;
  model.eps = spec.eps.value_or(kDefaultEps);
  model.use_pooled_statistics = spec.use_pooled_statistics;
  model.num_batches_tracked = spec.num_batches_tracked;
  model.running_mean = ChannelArray(spec.running_mean, c, 0.0);
  model.running_var = ChannelArray(spec.running_var, c, 1.0);
  model.weight = ChannelArray(spec.weight, c, 1.0);
  model.bias = ChannelArray(spec.bias, c, 0.0);
  model.generation = 1;
  return model;
}

namespace {

// `status` with `prefix` before its message (which starts with the field).
absl::Status Prefixed(const absl::Status& status, absl::string_view prefix) {
  if (status.ok() || prefix.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// INVALID_ARGUMENT unless the pooled arrays of `state` fit its sample_count
// and num_features.
absl::Status ValidatePooled(const ModelStateSpec& state) {
  const int64_t c = state.config.num_features;
  if (state.sample_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample_count: must be >= 0, got ", state.sample_count));
  }
  if (state.sample_count == 0) {
    for (const auto& [values, field] :
         {std::pair{&state.pooled_mean, "mean"},
          std::pair{&state.pooled_m2, "pooled_m2"},
          std::pair{&state.pooled_var, "var"}}) {
      if (!values->empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(field, ": has ", values->size(),
                         " values but sample_count is 0 (nothing fitted)"));
      }
    }
    return absl::OkStatus();
  }
  if (static_cast<int64_t>(state.pooled_mean.size()) != c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mean: has ", state.pooled_mean.size(), " values, expected ",
        "num_features = ", c, " (sample_count is ", state.sample_count, ")"));
  }
  if (state.pooled_m2.empty() &&
      static_cast<int64_t>(state.pooled_var.size()) != c) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pooled_m2: is empty and var has ", state.pooled_var.size(),
        " values; one of them needs num_features = ", c, " (sample_count is ",
        state.sample_count, ")"));
  }
  if (absl::Status s = CheckChannelArray(state.pooled_mean, c, "mean");
      !s.ok()) {
    return s;
  }
  return state.pooled_m2.empty()
             ? CheckChannelArray(state.pooled_var, c, "var",
                                 /*non_negative=*/true)
             : CheckChannelArray(state.pooled_m2, c, "pooled_m2",
                                 /*non_negative=*/true);
}

// Merges per-channel batch moments into the pooled statistics.
void MergePooled(BatchNormModel& model, absl::Span<const Moments> batch) {
  if (model.pooled.empty()) {
    model.pooled.assign(batch.begin(), batch.end());
  } else {
    for (size_t c = 0; c < batch.size(); ++c) {
      MergeMoments(model.pooled[c], batch[c]);
    }
  }
  model.sample_count += batch.empty() ? 0 : batch[0].count;
}

// (weight_a * a + weight_b * b) / (weight_a + weight_b), per channel, into a.
void WeightedAverage(std::vector<double>& a, double weight_a,
                     const std::vector<double>& b, double weight_b) {
  const double total = weight_a + weight_b;
  for (size_t c = 0; c < a.size(); ++c) {
    a[c] = (weight_a * a[c] + weight_b * b[c]) / total;
  }
}

}  // namespace

absl::Status ValidateModelState(const ModelStateSpec& state,
                                absl::string_view field_prefix) {
  absl::Status status = ValidateModelSpec(state.config);
  if (status.ok()) status = ValidatePooled(state);
  return Prefixed(status, field_prefix);
}

absl::StatusOr<BatchNormModel> MakeModelFromState(
    const ModelStateSpec& state, absl::string_view field_prefix) {
  if (absl::Status s = ValidateModelState(state, field_prefix); !s.ok()) {
    return s;
  }
  absl::StatusOr<BatchNormModel> model = MakeModel(state.config);
  if (!model.ok()) return Prefixed(model.status(), field_prefix);
  model->sample_count = state.sample_count;
  if (state.sample_count > 0) {
    const auto n = static_cast<double>(state.sample_count);
    model->pooled.resize(model->num_features);
    for (int64_t c = 0; c < model->num_features; ++c) {
      model->pooled[c] = {.count = state.sample_count,
                          .mean = state.pooled_mean[c],
                          .m2 = state.pooled_m2.empty()
                                    ? state.pooled_var[c] * n
                                    : state.pooled_m2[c]};
    }
  }
  model->generation = std::max<uint64_t>(state.generation, 1);
  return model;
}

absl::Status MergeModelStatistics(BatchNormModel& into,
                                  const BatchNormModel& source) {
  if (source.num_features != into.num_features) {
    return absl::FailedPreconditionError(
        absl::StrCat("source.num_features: is ", source.num_features,
                     " but model '", into.name, "' has ", into.num_features));
  }
  if (source.cumulative_average != into.cumulative_average) {
    return absl::FailedPreconditionError(absl::StrCat(
        "source.cumulative_average: is ",
        source.cumulative_average ? "true" : "false", " but model '", into.name,
        "' has ", into.cumulative_average ? "true" : "false",
        "; running statistics of the two kinds do not merge"));
  }
  // Running statistics first: the weights are the counts before the merge.
  double weight_into = static_cast<double>(into.num_batches_tracked);
  double weight_source = static_cast<double>(source.num_batches_tracked);
  if (weight_into + weight_source == 0) {
    weight_into = static_cast<double>(into.sample_count);
    weight_source = static_cast<double>(source.sample_count);
  }
  if (weight_into + weight_source > 0) {
    WeightedAverage(into.running_mean, weight_into, source.running_mean,
                    weight_source);
    WeightedAverage(into.running_var, weight_into, source.running_var,
                    weight_source);
  }
  if (!source.pooled.empty()) MergePooled(into, source.pooled);
  into.num_batches_tracked += source.num_batches_tracked;
  into.generation += 1;
  return absl::OkStatus();
}

BatchNormModel MakeDefaultModel(absl::string_view name, int64_t num_features) {
  BatchNormModel model;
  model.name = std::string(name);
  model.num_features = num_features;
  model.running_mean.assign(num_features, 0.0);
  model.running_var.assign(num_features, 1.0);
  model.weight.assign(num_features, 1.0);
  model.bias.assign(num_features, 0.0);
  model.generation = 1;
  return model;
}

namespace {

// running <- (1 - factor) running + factor target, per channel.
void MoveTowards(std::vector<double>& running, double factor,
                 absl::Span<const double> target) {
  for (size_t c = 0; c < running.size(); ++c) {
    running[c] = (1.0 - factor) * running[c] + factor * target[c];
  }
}

}  // namespace

void ApplyTrainingStep(BatchNormModel& model, absl::Span<const Moments> batch) {
  const int64_t per_channel = batch.empty() ? 0 : batch[0].count;
  MergePooled(model, batch);
  if (per_channel > 1) {
    model.num_batches_tracked += 1;
    const double factor =
        model.cumulative_average
            ? 1.0 / static_cast<double>(model.num_batches_tracked)
            : model.momentum;
    std::vector<double> mean(batch.size());
    std::vector<double> var(batch.size());
    for (size_t c = 0; c < batch.size(); ++c) {
      mean[c] = batch[c].mean;
      var[c] = batch[c].UnbiasedVariance();
    }
    MoveTowards(model.running_mean, factor, mean);
    MoveTowards(model.running_var, factor, var);
  }
  model.generation += 1;
}

void ApplyInstanceStep(BatchNormModel& model, absl::Span<const Moments> pooled,
                       absl::Span<const double> running_targets) {
  const size_t channels = pooled.size();
  MergePooled(model, pooled);
  MoveTowards(model.running_mean, model.momentum,
              running_targets.subspan(0, channels));
  MoveTowards(model.running_var, model.momentum,
              running_targets.subspan(channels, channels));
  model.generation += 1;
}

void ResetStatistics(BatchNormModel& model) {
  std::fill(model.running_mean.begin(), model.running_mean.end(), 0.0);
  std::fill(model.running_var.begin(), model.running_var.end(), 1.0);
  model.num_batches_tracked = 0;
  model.sample_count = 0;
  model.pooled.clear();
  model.generation += 1;
}

}  // namespace normd

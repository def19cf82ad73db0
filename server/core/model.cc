#include "server/core/model.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace normd {
namespace {

constexpr size_t kMaxNameLength = 128;

// The character that starts at name[i], for an error message: its Unicode
// code point ("U+00E9 'é'") when the bytes there are well-formed UTF-8, else
// the byte ("byte 0xFF, not UTF-8").
std::string DescribeCharacter(absl::string_view name, size_t i) {
  const auto byte = [&](size_t k) {
    return static_cast<unsigned char>(name[k]);
  };
  const unsigned char lead = byte(i);
  int length = 0;
  uint32_t code_point = 0;
  if (lead < 0x80) {
    length = 1;
    code_point = lead;
  } else if ((lead & 0xE0) == 0xC0) {
    length = 2;
    code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3;
    code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4;
    code_point = lead & 0x07;
  }
  bool well_formed = length > 0 && i + length <= name.size();
  for (int k = 1; well_formed && k < length; ++k) {
    well_formed = (byte(i + k) & 0xC0) == 0x80;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not UTF-8.
  constexpr uint32_t kSmallest[] = {0, 0, 0x80, 0x800, 0x10000};
  well_formed = well_formed && code_point >= kSmallest[length] &&
                code_point <= 0x10FFFF &&
                !(code_point >= 0xD800 && code_point <= 0xDFFF);
  if (!well_formed) return absl::StrFormat("byte 0x%02X (not UTF-8)", lead);
  std::string out = absl::StrFormat("U+%04X", code_point);
  if (code_point >= 0x20 && code_point != 0x7F &&
      !(code_point >= 0x80 && code_point < 0xA0)) {
    absl::StrAppend(&out, " '", name.substr(i, length), "'");
  }
  return out;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
         c == '/' || c == '-';
}

// What a model and a CreateModel spec are checked for alike: the name,
// num_features >= 1, momentum in [0, 1], eps, num_batches_tracked >= 0 and
// the four per-channel arrays (num_features finite values, running_var >=
// 0; a spec may leave an array empty to ask for PyTorch's default).
absl::Status ValidateConfig(
    absl::string_view name, int64_t num_features, double momentum, double eps,
    int64_t num_batches_tracked, const std::vector<double>& running_mean,
    const std::vector<double>& running_var, const std::vector<double>& weight,
    const std::vector<double>& bias, bool empty_arrays_allowed) {
  if (absl::Status s = ValidateModelName(name, "name"); !s.ok()) return s;
  if (num_features < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_features: must be >= 1, got ", num_features));
  }
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("momentum: must be in [0, 1], got ", momentum));
  }
  if (absl::Status s = ValidateEps(eps, "eps"); !s.ok()) return s;
  if (num_batches_tracked < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_batches_tracked: must be >= 0, got ", num_batches_tracked));
  }
  for (const auto& [values, field, non_negative] :
       {std::tuple{&running_mean, "running_mean", false},
        std::tuple{&running_var, "running_var", true},
        std::tuple{&weight, "weight", false},
        std::tuple{&bias, "bias", false}}) {
    if (absl::Status s = CheckChannelArray(*values, num_features, field,
                                           non_negative, empty_arrays_allowed);
        !s.ok()) {
      return s;
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

absl::Status CheckChannelArray(const std::vector<double>& values,
                               int64_t channels, absl::string_view field,
                               bool non_negative, bool empty_allowed) {
  if (values.empty() && empty_allowed) return absl::OkStatus();
  if (static_cast<int64_t>(values.size()) != channels) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": has ", values.size(), " values, expected num_features = ",
        channels, empty_allowed ? " or 0" : ""));
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

absl::Status ValidateModelName(absl::string_view name,
                               absl::string_view field) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": must be 1-", kMaxNameLength,
        " characters of [A-Za-z0-9._:/-], got ", name.size(), " characters"));
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i])) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": character ", DescribeCharacter(name, i), " at byte ", i,
          " is not allowed; use [A-Za-z0-9._:/-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckNotReservedModelName(absl::string_view name,
                                       absl::string_view field) {
  constexpr absl::string_view kReserved[] = {"layer_norm", "rms_norm",
                                             "group_norm", "instance_norm",
                                             "l2_norm",    "weight_norm"};
  for (absl::string_view reserved : kReserved) {
    if (name == reserved) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": \"", name,
          "\" is reserved for the Open Inference Protocol's built-in "
          "stateless model of that name; choose another name"));
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
  return ValidateConfig(
      spec.name, spec.num_features, spec.momentum.value_or(kDefaultMomentum),
      spec.eps.value_or(kDefaultEps), spec.num_batches_tracked,
      spec.running_mean, spec.running_var, spec.weight, spec.bias,
      /*empty_arrays_allowed=*/true);
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
  if (spec.reference_from_running) {
    model.reference =
        DriftReference{.source = ReferenceSource::kCheckpoint,
                       .set_unix_nanos = absl::ToUnixNanos(absl::Now()),
                       .mean = model.running_mean,
                       .var = model.running_var};
  }
  return model;
}

absl::Status ValidateModel(const BatchNormModel& model) {
  if (absl::Status s = ValidateConfig(
          model.name, model.num_features, model.momentum, model.eps,
          model.num_batches_tracked, model.running_mean, model.running_var,
          model.weight, model.bias, /*empty_arrays_allowed=*/false);
      !s.ok()) {
    return s;
  }
  const int64_t c = model.num_features;
  if (model.sample_count < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sample_count: must be >= 0, got ", model.sample_count));
  }
  if (model.pooled.size() != (model.sample_count == 0 ? 0 : size_t(c))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mean: has ", model.pooled.size(), " pooled statistics, expected ",
        model.sample_count == 0 ? 0 : c, " (sample_count is ",
        model.sample_count, ")"));
  }
  for (size_t i = 0; i < model.pooled.size(); ++i) {
    const Moments& m = model.pooled[i];
    if (m.count != model.sample_count) {
      return absl::InvalidArgumentError(
          absl::StrCat("mean[", i, "]: pooled over ", m.count,
                       " values but sample_count is ", model.sample_count));
    }
    if (!std::isfinite(m.mean)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mean[", i, "]: ", m.mean, " is not finite"));
    }
    if (!std::isfinite(m.m2) || m.m2 < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("var[", i, "]: its sum of squared deviations, ", m.m2,
                       ", is not finite and >= 0"));
    }
  }
  if (model.generation < 1) {
    return absl::InvalidArgumentError("generation: must be >= 1, got 0");
  }
  if (model.reference.has_value()) {
    return ValidateReference(*model.reference, c, "reference");
  }
  return absl::OkStatus();
}

absl::Status CheckCounterAdd(int64_t value, int64_t add,
                             absl::string_view field) {
  int64_t sum;
  if (__builtin_add_overflow(value, add, &sum)) {
    return absl::OutOfRangeError(absl::StrCat(
        field, ": ", value, " + ", add,
        " overflows a 64-bit count; nothing was changed (ResetModel or "
        "DeleteModel starts the count again)"));
  }
  return absl::OkStatus();
}

absl::Status CheckGenerationAdd(uint64_t generation, uint64_t add) {
  uint64_t sum;
  if (__builtin_add_overflow(generation, add, &sum)) {
    return absl::OutOfRangeError(absl::StrCat(
        "generation: ", generation, " + ", add,
        " overflows a 64-bit count; nothing was changed (DeleteModel, then "
        "import the state with a smaller generation)"));
  }
  return absl::OkStatus();
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

// Merges per-channel batch moments into the pooled statistics. The caller
// has checked that sample_count + the batch's count fits (CheckCounterAdd).
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

// (weight_a * a + weight_b * b) / (weight_a + weight_b), per channel, into
// a; the weights are made fractions first, so that averaging values near the
// top of the double range does not overflow on the way.
void WeightedAverage(std::vector<double>& a, double weight_a,
                     const std::vector<double>& b, double weight_b) {
  const double total = weight_a + weight_b;
  const double fraction_a = weight_a / total;
  const double fraction_b = weight_b / total;
  for (size_t c = 0; c < a.size(); ++c) {
    a[c] = fraction_a * a[c] + fraction_b * b[c];
  }
}

}  // namespace

absl::Status ValidateModelState(const ModelStateSpec& state,
                                absl::string_view field_prefix) {
  absl::Status status = ValidateModelSpec(state.config);
  if (status.ok()) status = ValidatePooled(state);
  if (status.ok() && state.reference.has_value()) {
    status = ValidateReference(*state.reference, state.config.num_features,
                               "reference");
  }
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
  model->reference = state.reference;
  // The arrays were checked one by one; what they make together (var x
  // sample_count) must be representable too.
  if (absl::Status s = ValidateModel(*model); !s.ok()) {
    return absl::OutOfRangeError(
        absl::StrCat(field_prefix, s.message(), " (from var x sample_count)"));
  }
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
  const int64_t source_count =
      source.pooled.empty() ? 0 : source.pooled[0].count;
  if (absl::Status s =
          CheckCounterAdd(into.sample_count, source_count, "sample_count");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckCounterAdd(into.num_batches_tracked, source.num_batches_tracked,
                          "num_batches_tracked");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckGenerationAdd(into.generation, 1); !s.ok()) {
    return s;
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

absl::Status ValidateBatchMoments(absl::Span<const Moments> batch) {
  for (size_t c = 0; c < batch.size(); ++c) {
    const Moments& m = batch[c];
    if (m.count < 1 || m.count != batch[0].count || !std::isfinite(m.mean) ||
        !std::isfinite(m.m2) || m.m2 < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch[", c, "]: moments of ", m.count, " values (mean ",
                       m.mean, ", M2 ", m.m2, ") are not ", batch[0].count,
                       " > 0 values with a finite mean and a finite M2 >= 0"));
    }
  }
  return absl::OkStatus();
}

absl::Status ApplyTrainingStep(BatchNormModel& model,
                               absl::Span<const Moments> batch) {
  if (absl::Status s = ValidateBatchMoments(batch); !s.ok()) return s;
  const int64_t per_channel = batch.empty() ? 0 : batch[0].count;
  if (absl::Status s =
          CheckCounterAdd(model.sample_count, per_channel, "sample_count");
      !s.ok()) {
    return s;
  }
  if (per_channel > 1) {
    if (absl::Status s = CheckCounterAdd(model.num_batches_tracked, 1,
                                         "num_batches_tracked");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckGenerationAdd(model.generation, 1); !s.ok()) {
    return s;
  }
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
  return absl::OkStatus();
}

absl::Status ApplyInstanceStep(BatchNormModel& model,
                               absl::Span<const Moments> pooled,
                               absl::Span<const double> running_targets) {
  const size_t channels = pooled.size();
  if (absl::Status s = ValidateBatchMoments(pooled); !s.ok()) return s;
  if (absl::Status s =
          CheckCounterAdd(model.sample_count,
                          pooled.empty() ? 0 : pooled[0].count, "sample_count");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckGenerationAdd(model.generation, 1); !s.ok()) {
    return s;
  }
  MergePooled(model, pooled);
  MoveTowards(model.running_mean, model.momentum,
              running_targets.subspan(0, channels));
  MoveTowards(model.running_var, model.momentum,
              running_targets.subspan(channels, channels));
  model.generation += 1;
  return absl::OkStatus();
}

absl::Status ResetStatistics(BatchNormModel& model) {
  if (absl::Status s = CheckGenerationAdd(model.generation, 1); !s.ok()) {
    return s;
  }
  std::fill(model.running_mean.begin(), model.running_mean.end(), 0.0);
  std::fill(model.running_var.begin(), model.running_var.end(), 1.0);
  model.num_batches_tracked = 0;
  model.sample_count = 0;
  model.pooled.clear();
  model.generation += 1;
  return absl::OkStatus();
}

}  // namespace normd

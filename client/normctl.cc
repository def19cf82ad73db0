// normctl: command-line client for normd. Run `normctl --help`.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/checkpoint/checkpoint.h"
#include "client/checkpoint/safetensors.h"
#include "client/client.h"
#include "client/json_output.h"
#include "client/normctl_commands.h"
#include "client/npy.h"
#include "client/tensor_io.h"

// The flags; what each means for a command is in that command's entry of
// client/normctl_commands.cc (`normctl COMMAND --help`). Numbers that may
// be absent (--eps, --momentum, --channel_axis) are strings: "" = unset.
ABSL_FLAG(std::string, server, "localhost:50051",
          "See normctl COMMAND --help.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30),
          "See normctl COMMAND --help.");
ABSL_FLAG(std::string, tls_ca, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, tls_cert, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, tls_key, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, token_file, "", "See normctl COMMAND --help.");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20, "See normctl COMMAND --help.");
ABSL_FLAG(absl::Duration, connect_timeout, absl::Seconds(5),
          "See normctl COMMAND --help.");
ABSL_FLAG(bool, json, false, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, input, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, output, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, prefix, "", "See normctl COMMAND --help.");
ABSL_FLAG(uint64_t, max_header_bytes, normd::client::kDefaultMaxHeaderBytes,
          "See normctl COMMAND --help.");
ABSL_FLAG(int64_t, chunk_bytes, 4 << 20, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, progress, "auto", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, model, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, group, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, mode, "layer_norm", "See normctl COMMAND --help.");
ABSL_FLAG(bool, training, false, "See normctl COMMAND --help.");
ABSL_FLAG(int64_t, num_groups, 0, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, layer_norm_style, "pytorch",
          "See normctl COMMAND --help.");
ABSL_FLAG(std::string, shape, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, values, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, input_file, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, output_file, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, dtype, "float32", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, channel_axis, "", "See normctl COMMAND --help.");
ABSL_FLAG(int, normalized_ndim, 1, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, eps, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, weight, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, bias, "", "See normctl COMMAND --help.");
ABSL_FLAG(int64_t, num_features, 0, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, momentum, "", "See normctl COMMAND --help.");
ABSL_FLAG(bool, cumulative_average, false, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, running_mean, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, running_var, "", "See normctl COMMAND --help.");
ABSL_FLAG(int64_t, num_batches_tracked, 0, "See normctl COMMAND --help.");
ABSL_FLAG(bool, use_pooled_statistics, false, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, state_file, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, from, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, from_model, "", "See normctl COMMAND --help.");
ABSL_FLAG(bool, create_only, false, "See normctl COMMAND --help.");
ABSL_FLAG(std::string, service, "", "See normctl COMMAND --help.");
ABSL_FLAG(std::string, request_id, "", "See normctl COMMAND --help.");

namespace normd::client {
namespace {

// Exit status: success, a server error (printed with its gRPC code), bad
// usage (nothing was sent), the server could not be reached.
constexpr int kExitOk = 0;
constexpr int kExitServerError = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;

bool Json() { return absl::GetFlag(FLAGS_json); }

// Prints the error (as JSON with --json) and returns the exit status.
int Fail(const absl::Status& status, int code = kExitServerError) {
  if (Json()) {
    std::cerr << "{\"code\": "
              << JsonString(absl::StatusCodeToString(status.code()))
              << ", \"message\": " << JsonString(status.message()) << "}\n";
  } else {
    std::cerr << "normctl: " << absl::StatusCodeToString(status.code()) << ": "
              << status.message() << "\n";
  }
  return code;
}

// A local problem (bad usage, a file that cannot be read or written): its
// message, which names the flag or the file, and no gRPC code. Exit 2.
int FailLocal(const absl::Status& status) {
  if (Json()) {
    std::cerr << "{\"message\": " << JsonString(status.message()) << "}\n";
  } else {
    std::cerr << "normctl: " << status.message() << "\n";
  }
  return kExitUsage;
}

// The proto3 JSON form of a model's state, for `export` files: what
// `import --state_file` and the other clients read back.
std::string ToJson(const google::protobuf::Message& message,
                   bool all_fields = false) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = all_fields;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

// --json: numbers as numbers (shapes, counts, tensor data).
void PrintJson(const google::protobuf::Message& message) {
  std::cout << MessageToJson(message);
}

// "running", "pooled", "explicit" or "checkpoint".
std::string SourceName(v1::ReferenceSource source) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::ReferenceSource_Name(source), "REFERENCE_"));
}

void PrintModel(const v1::ModelState& m) {
  std::cout << absl::StrFormat(
      "model %s\n  num_features: %d  eps: %g  %s  use_pooled_statistics: %s\n"
      "  num_batches_tracked: %d  sample_count: %d  generation: %d\n",
      m.name(), m.num_features(), m.eps(),
      m.cumulative_average() ? std::string("cumulative_average: true")
                             : absl::StrFormat("momentum: %g", m.momentum()),
      m.use_pooled_statistics() ? "true" : "false", m.num_batches_tracked(),
      m.sample_count(), m.generation());
  if (m.running_mean_size() > 0) {
    std::cout << "  running_mean: " << FormatList(m.running_mean()) << "\n"
              << "  running_var:  " << FormatList(m.running_var()) << "\n";
    if (m.mean_size() > 0) {
      std::cout << "  mean (pooled): " << FormatList(m.mean()) << "\n"
                << "  var (pooled):  " << FormatList(m.var()) << "\n";
    }
    std::cout << "  weight: " << FormatList(m.weight()) << "\n"
              << "  bias:   " << FormatList(m.bias()) << "\n";
  }
  if (m.has_reference()) {
    std::cout << "  reference (" << SourceName(m.reference().source())
              << "): mean " << FormatList(m.reference().mean()) << "  var "
              << FormatList(m.reference().var()) << "\n";
  }
}

absl::StatusOr<std::vector<double>> OptionalValues(const std::string& text,
                                                   absl::string_view flag) {
  if (text.empty()) return std::vector<double>();
  return ParseValues(text, flag);
}

absl::StatusOr<double> ParseDouble(const std::string& text,
                                   absl::string_view flag) {
  absl::StatusOr<std::vector<double>> v = ParseValues(text, flag);
  if (!v.ok()) return v.status();
  if (v->size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": expected one number"));
  }
  return (*v)[0];
}

// The number of elements of a tensor of `shape`, or nullopt when a
// dimension is negative or the product overflows (the server names those).
std::optional<int64_t> ElementCount(const std::vector<int64_t>& shape) {
  int64_t count = 1;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(count, dim, &count)) {
      return std::nullopt;
    }
  }
  return count;
}

// The input tensor from --input (.npy), or --shape with --values or
// --input_file.
absl::StatusOr<v1::Tensor> InputTensor() {
  const std::string npy = absl::GetFlag(FLAGS_input);
  const std::string file = absl::GetFlag(FLAGS_input_file);
  const bool has_values = !absl::GetFlag(FLAGS_values).empty();
  if (int given = !npy.empty() + !file.empty() + has_values; given != 1) {
    return absl::InvalidArgumentError(
        given == 0 ? "--input: required (a .npy file), or --shape with "
                     "--values or --input_file"
                   : "--input, --input_file and --values: give only one");
  }
  if (!npy.empty()) {
    if (!absl::GetFlag(FLAGS_shape).empty()) {
      return absl::InvalidArgumentError(
          "--shape: not with --input (the .npy file has its shape)");
    }
    return ReadNpy(npy);
  }
  absl::StatusOr<v1::DataType> dtype =
      ParseDataType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  if (absl::GetFlag(FLAGS_shape).empty()) {
    return absl::InvalidArgumentError("--shape: required, e.g. --shape=2,3");
  }
  absl::StatusOr<std::vector<int64_t>> shape =
      ParseShape(absl::GetFlag(FLAGS_shape), "--shape");
  if (!shape.ok()) return shape.status();
  if (!file.empty()) {
    absl::StatusOr<std::string> bytes = ReadFile(file);
    if (!bytes.ok()) return bytes.status();
    return MakeRawTensor(*shape, *std::move(bytes), *dtype);
  }
  absl::StatusOr<std::vector<double>> values =
      ParseValues(absl::GetFlag(FLAGS_values), "--values");
  if (!values.ok()) return values.status();
  if (std::optional<int64_t> count = ElementCount(*shape);
      count.has_value() && *count != static_cast<int64_t>(values->size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("--values: ", values->size(), " values, but --shape=",
                     absl::GetFlag(FLAGS_shape), " has ", *count, " elements"));
  }
  return MakeTensor(*shape, *values, *dtype);
}

// Sets the request's weight or bias to the float64 vector in `text`, if any.
absl::Status AffineTensor(const std::string& text, absl::string_view flag,
                          v1::NormalizeRequest& request,
                          v1::Tensor* (v1::NormalizeRequest::*field)()) {
  if (text.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<double>> values = ParseValues(text, flag);
  if (!values.ok()) return values.status();
  *(request.*field)() =
      MakeTensor({static_cast<int64_t>(values->size())}, *values, v1::FLOAT64);
  return absl::OkStatus();
}

// The number in a string flag, or nullopt when the flag is empty.
absl::StatusOr<std::optional<double>> OptionalNumber(
    const absl::Flag<std::string>& flag, absl::string_view name) {
  const std::string text = absl::GetFlag(flag);
  if (text.empty()) return std::nullopt;
  absl::StatusOr<double> value = ParseDouble(text, name);
  if (!value.ok()) return value.status();
  return *value;
}

int RunNormalize(NormdClient& client) {
  v1::NormalizeRequest request;
  v1::Mode mode;
  if (!v1::Mode_Parse(absl::AsciiStrToUpper(absl::GetFlag(FLAGS_mode)),
                      &mode) ||
      mode == v1::MODE_UNSPECIFIED) {
    return FailLocal(absl::InvalidArgumentError(
        "--mode: expected layer_norm, batch_norm, group_norm, "
        "instance_norm, rms_norm, l2_norm or weight_norm"));
  }
  request.set_mode(mode);
  const std::string style =
      absl::AsciiStrToLower(absl::GetFlag(FLAGS_layer_norm_style));
  if (style == "bert") {
    request.set_layer_norm_style(v1::BERT_UNBIASED_STD);
  } else if (style != "pytorch") {
    return FailLocal(absl::InvalidArgumentError(
        "--layer_norm_style: expected pytorch or bert"));
  }
  request.set_num_groups(absl::GetFlag(FLAGS_num_groups));
  absl::StatusOr<v1::Tensor> input = InputTensor();
  if (!input.ok()) return FailLocal(input.status());
  *request.mutable_input() = *std::move(input);
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_training(absl::GetFlag(FLAGS_training));
  // Only the row modes take normalized_ndim (weight_norm refuses it).
  if (mode == v1::LAYER_NORM || mode == v1::RMS_NORM || mode == v1::L2_NORM) {
    request.set_normalized_ndim(absl::GetFlag(FLAGS_normalized_ndim));
  }
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  auto axis = OptionalNumber(FLAGS_channel_axis, "--channel_axis");
  if (!axis.ok()) return FailLocal(axis.status());
  if (axis->has_value()) request.set_channel_axis(static_cast<int>(**axis));
  auto eps = OptionalNumber(FLAGS_eps, "--eps");
  if (!eps.ok()) return FailLocal(eps.status());
  if (eps->has_value()) request.set_eps(**eps);
  if (absl::Status s =
          AffineTensor(absl::GetFlag(FLAGS_weight), "--weight", request,
                       &v1::NormalizeRequest::mutable_weight);
      !s.ok()) {
    return FailLocal(s);
  }
  if (absl::Status s =
          AffineTensor(absl::GetFlag(FLAGS_bias), "--bias", request,
                       &v1::NormalizeRequest::mutable_bias);
      !s.ok()) {
    return FailLocal(s);
  }

  absl::StatusOr<v1::NormalizeResponse> response = client.Normalize(request);
  if (!response.ok()) return Fail(response.status());
  const std::string out_file = absl::GetFlag(FLAGS_output_file);
  if (!out_file.empty()) {
    if (absl::Status s = WriteFile(out_file, response->output().data());
        !s.ok()) {
      return FailLocal(s);
    }
  }
  const std::string npy = absl::GetFlag(FLAGS_output);
  if (!npy.empty()) {
    if (absl::Status s = WriteNpy(npy, response->output()); !s.ok()) {
      return FailLocal(s);
    }
    response->mutable_output()->clear_data();  // Not printed again.
  }
  if (Json()) {
    PrintJson(*response);
    return kExitOk;
  }
  if (!npy.empty()) {
    std::cout << absl::StrFormat(
        "wrote %s: %s [%s]\n", npy,
        v1::DataType_Name(response->output().dtype()),
        absl::StrJoin(response->output().shape(), ","));
    if (response->has_model()) PrintModel(response->model());
    return kExitOk;
  }
  std::string shape = absl::StrJoin(response->output().shape(), ",");
  std::cout << absl::StrFormat(
      "output %s [%s]:\n%s\n",
      v1::DataType_Name(response->output().dtype() == v1::DATA_TYPE_UNSPECIFIED
                            ? v1::FLOAT32
                            : response->output().dtype()),
      shape, FormatTensor(response->output()));
  if (response->has_model()) PrintModel(response->model());
  return kExitOk;
}

// A progress bar on stderr ("\r[#####-----]  50%  12.0/24.0 MiB  3 steps").
class ProgressBar {
 public:
  ProgressBar(int64_t total_bytes, bool enabled)
      : total_(total_bytes), enabled_(enabled) {}
  void Update(int64_t done_bytes, int64_t steps) {
    if (!enabled_) return;
    constexpr int kWidth = 30;
    const double fraction =
        total_ > 0 ? static_cast<double>(done_bytes) / total_ : 1.0;
    const int filled = static_cast<int>(fraction * kWidth);
    std::cerr << absl::StrFormat(
        "\r[%s%s] %3d%%  %.1f/%.1f MiB  %d steps", std::string(filled, '#'),
        std::string(kWidth - filled, '-'), static_cast<int>(fraction * 100),
        done_bytes / 1048576.0, total_ / 1048576.0, steps);
    std::cerr.flush();
  }
  void Finish() {
    if (enabled_) std::cerr << "\n";
  }

 private:
  const int64_t total_;
  const bool enabled_;
};

absl::StatusOr<bool> ProgressEnabled() {
  const std::string mode = absl::GetFlag(FLAGS_progress);
  if (mode == "always") return true;
  if (mode == "never") return false;
  if (mode == "auto") return isatty(STDERR_FILENO) == 1;
  return absl::InvalidArgumentError(
      "--progress: expected auto, always or never");
}

// fit --input big.npy: the file's rows in --chunk_bytes messages on one
// FitStream, never all in memory.
int RunFitStream(NormdClient& client, const v1::FitRequest& base,
                 absl::Duration timeout) {
  const std::string path = absl::GetFlag(FLAGS_input);
  const int64_t chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes);
  if (chunk_bytes <= 0) {
    return FailLocal(absl::InvalidArgumentError("--chunk_bytes: must be > 0"));
  }
  absl::StatusOr<bool> progress = ProgressEnabled();
  if (!progress.ok()) return FailLocal(progress.status());
  absl::StatusOr<std::unique_ptr<NpyReader>> reader = NpyReader::Open(path);
  if (!reader.ok()) return FailLocal(reader.status());
  NpyReader& npy = **reader;
  const int64_t rows = npy.rows_left();
  const int64_t rows_per_step =
      std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(1, npy.row_bytes()));
  const int64_t steps =
      std::max<int64_t>(1, (rows + rows_per_step - 1) / rows_per_step);
  ProgressBar bar(rows * npy.row_bytes(), *progress);
  int64_t sent = 0, steps_sent = 0;
  absl::StatusOr<v1::FitResponse> response = client.FitStream(
      base.model(), timeout * static_cast<double>(steps),
      [&](v1::FitRequest& request) -> absl::StatusOr<bool> {
        bar.Update(sent * npy.row_bytes(), steps_sent);
        // An empty file still sends one (empty) step, which the server
        // refuses with a message naming the input.
        if (steps_sent > 0 && npy.rows_left() == 0) return false;
        ++steps_sent;
        request = base;
        absl::StatusOr<v1::Tensor> chunk = npy.ReadRows(rows_per_step);
        if (!chunk.ok()) return chunk.status();
        sent += chunk->shape(0);
        *request.mutable_input() = *std::move(chunk);
        return true;
      });
  bar.Update(sent * npy.row_bytes(), steps_sent);
  bar.Finish();
  if (!response.ok()) return Fail(response.status());
  if (Json()) {
    PrintJson(*response);
  } else {
    std::cout << absl::StrFormat("fitted %s: %d rows in %d steps\n", path, rows,
                                 steps);
    PrintModel(response->model());
  }
  return kExitOk;
}

int RunFit(NormdClient& client, absl::Duration timeout) {
  v1::FitRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  auto axis = OptionalNumber(FLAGS_channel_axis, "--channel_axis");
  if (!axis.ok()) return FailLocal(axis.status());
  if (axis->has_value()) request.set_channel_axis(static_cast<int>(**axis));
  if (!absl::GetFlag(FLAGS_input).empty() &&
      absl::GetFlag(FLAGS_input_file).empty() &&
      absl::GetFlag(FLAGS_values).empty() &&
      absl::GetFlag(FLAGS_shape).empty()) {
    return RunFitStream(client, request, timeout);
  }
  absl::StatusOr<v1::Tensor> input = InputTensor();
  if (!input.ok()) return FailLocal(input.status());
  *request.mutable_input() = *std::move(input);
  absl::StatusOr<v1::FitResponse> response = client.Fit(request);
  if (!response.ok()) return Fail(response.status());
  if (Json()) {
    PrintJson(*response);
  } else {
    PrintModel(response->model());
  }
  return kExitOk;
}

int RunCreate(NormdClient& client) {
  v1::CreateModelRequest request;
  request.set_name(absl::GetFlag(FLAGS_model));
  request.set_num_features(absl::GetFlag(FLAGS_num_features));
  request.set_cumulative_average(absl::GetFlag(FLAGS_cumulative_average));
  request.set_num_batches_tracked(absl::GetFlag(FLAGS_num_batches_tracked));
  request.set_use_pooled_statistics(absl::GetFlag(FLAGS_use_pooled_statistics));
  auto momentum = OptionalNumber(FLAGS_momentum, "--momentum");
  if (!momentum.ok()) return FailLocal(momentum.status());
  if (momentum->has_value()) request.set_momentum(**momentum);
  auto eps = OptionalNumber(FLAGS_eps, "--eps");
  if (!eps.ok()) return FailLocal(eps.status());
  if (eps->has_value()) request.set_eps(**eps);
  for (auto [text, flag, field] :
       {std::tuple{absl::GetFlag(FLAGS_running_mean), "--running_mean",
                   request.mutable_running_mean()},
        std::tuple{absl::GetFlag(FLAGS_running_var), "--running_var",
                   request.mutable_running_var()},
        std::tuple{absl::GetFlag(FLAGS_weight), "--weight",
                   request.mutable_weight()},
        std::tuple{absl::GetFlag(FLAGS_bias), "--bias",
                   request.mutable_bias()}}) {
    absl::StatusOr<std::vector<double>> values = OptionalValues(text, flag);
    if (!values.ok()) return FailLocal(values.status());
    field->Assign(values->begin(), values->end());
  }
  absl::StatusOr<v1::ModelState> model = client.CreateModel(request);
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return kExitOk;
}

int RunModelCommand(NormdClient& client, absl::string_view command) {
  const std::string name = absl::GetFlag(FLAGS_model);
  if (command == "delete") {
    absl::Status status = client.DeleteModel(name);
    if (!status.ok()) return Fail(status);
    if (Json()) {
      std::cout << "{\"deleted\": " << JsonString(name) << "}\n";
    } else {
      std::cout << "deleted " << name << "\n";
    }
    return kExitOk;
  }
  absl::StatusOr<v1::ModelState> model =
      command == "get" ? client.GetModel(name) : client.ResetModel(name);
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return kExitOk;
}

// Prints an aligned table: each column as wide as its widest cell, the
// first (a name) left-aligned, the others (numbers) right-aligned.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      widths[c] = std::max(widths[c], row[c].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - row[c].size(), ' ');
      line += c == 0 ? row[c] + pad : "  " + pad + row[c];
    }
    std::cout << absl::StripTrailingAsciiWhitespace(line) << "\n";
  }
}

// The columns `list` and `import-checkpoint` print for a model.
std::vector<std::string> ModelRow(const v1::ModelState& m) {
  return {m.name(),
          absl::StrCat(m.num_features()),
          absl::StrCat(m.num_batches_tracked()),
          absl::StrCat(m.sample_count()),
          m.cumulative_average() ? std::string("cumulative")
                                 : absl::StrFormat("%g", m.momentum()),
          absl::StrFormat("%g", m.eps()),
          absl::StrCat(m.generation())};
}

const std::vector<std::string>& ModelHeader() {
  static const auto* header = new std::vector<std::string>{
      "NAME", "C", "BATCHES", "SAMPLES", "MOMENTUM", "EPS", "GENERATION"};
  return *header;
}

int RunList(NormdClient& client) {
  absl::StatusOr<v1::ListModelsResponse> list =
      client.ListModels(absl::GetFlag(FLAGS_group));
  if (!list.ok()) return Fail(list.status());
  if (Json()) {
    PrintJson(*list);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {ModelHeader()};
  for (const v1::ModelState& m : list->models()) rows.push_back(ModelRow(m));
  PrintTable(rows);
  return kExitOk;
}

// A measure of a drift report for a table: "-" while absent.
std::string Measure(bool present, double value) {
  return present ? absl::StrFormat("%.4g", value) : std::string("-");
}

// `drift`: every model with a reference by kl_max, or one model's summary
// and its ten worst channels.
int RunDrift(NormdClient& client) {
  const std::string name = absl::GetFlag(FLAGS_model);
  if (!name.empty()) {
    absl::StatusOr<v1::ModelState> model = client.GetModel(name);
    if (!model.ok()) return Fail(model.status());
    if (!model->has_drift()) {
      return Fail(absl::FailedPreconditionError(absl::StrCat(
          "model '", name,
          "' has no drift reference (normctl set-reference sets one)")));
    }
    const v1::DriftReport& d = model->drift();
    if (Json()) {
      PrintJson(d);
      return kExitOk;
    }
    std::cout << absl::StrFormat(
        "model %s\n  reference: %s, set %s\n  window: %d samples per channel "
        "in the last %d s\n",
        name, SourceName(d.reference_source()),
        absl::FormatTime(absl::FromUnixNanos(d.reference_set_unix_nanos()),
                         absl::UTCTimeZone()),
        d.window_samples(), d.window_seconds());
    if (!d.has_kl_max()) {
      std::cout << "  no measures yet: fewer samples than the server's "
                   "--drift_min_samples\n";
      return kExitOk;
    }
    std::cout << absl::StrFormat(
        "  kl_max: %.4g  kl_mean: %.4g  shift_max: %.4g  channels_drifted: "
        "%d of %d\n",
        d.kl_max(), d.kl_mean(), d.shift_max(), d.channels_drifted(),
        d.kl_size());
    std::vector<int> order(d.kl_size());
    for (int c = 0; c < d.kl_size(); ++c) order[c] = c;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return d.kl(a) > d.kl(b); });
    order.resize(std::min<size_t>(order.size(), 10));
    std::vector<std::vector<std::string>> rows = {{"CHANNEL", "KL", "SHIFT"}};
    for (int c : order) {
      rows.push_back({absl::StrCat(c), absl::StrFormat("%.4g", d.kl(c)),
                      absl::StrFormat("%.4g", d.shift(c))});
    }
    PrintTable(rows);
    return kExitOk;
  }
  absl::StatusOr<v1::ListModelsResponse> list = client.ListModels();
  if (!list.ok()) return Fail(list.status());
  std::vector<const v1::ModelState*> models;
  for (const v1::ModelState& m : list->models()) {
    if (m.has_drift()) models.push_back(&m);
  }
  std::stable_sort(models.begin(), models.end(),
                   [](const v1::ModelState* a, const v1::ModelState* b) {
                     const v1::DriftReport& x = a->drift();
                     const v1::DriftReport& y = b->drift();
                     if (x.has_kl_max() != y.has_kl_max()) {
                       return x.has_kl_max();
                     }
                     return x.kl_max() > y.kl_max();
                   });
  if (Json()) {
    v1::ListModelsResponse ranked;
    for (const v1::ModelState* m : models) *ranked.add_models() = *m;
    PrintJson(ranked);
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows = {{"NAME", "REFERENCE", "SAMPLES",
                                                 "KL_MAX", "KL_MEAN",
                                                 "SHIFT_MAX", "DRIFTED"}};
  for (const v1::ModelState* m : models) {
    const v1::DriftReport& d = m->drift();
    rows.push_back(
        {m->name(), SourceName(d.reference_source()),
         absl::StrCat(d.window_samples()), Measure(d.has_kl_max(), d.kl_max()),
         Measure(d.has_kl_mean(), d.kl_mean()),
         Measure(d.has_shift_max(), d.shift_max()),
         d.has_channels_drifted()
             ? absl::StrCat(d.channels_drifted(), "/", m->num_features())
             : std::string("-")});
  }
  PrintTable(rows);
  return kExitOk;
}

// `set-reference --from=running|pooled` and `clear-reference`.
int RunReference(NormdClient& client, absl::string_view command) {
  const std::string name = absl::GetFlag(FLAGS_model);
  absl::StatusOr<v1::ModelState> model;
  if (command == "clear-reference") {
    model = client.ClearReference(name);
  } else {
    const std::string from = absl::GetFlag(FLAGS_from);
    v1::SetReferenceRequest request;
    request.set_model(name);
    if (from == "running") {
      request.set_source(v1::REFERENCE_RUNNING);
    } else if (from == "pooled") {
      request.set_source(v1::REFERENCE_POOLED);
    } else {
      return FailLocal(absl::InvalidArgumentError(absl::StrCat(
          "--from: must be running or pooled, got \"", from, "\"")));
    }
    model = client.SetReference(request);
  }
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return kExitOk;
}

// --prefix and --input (import-checkpoint) or --output (export-checkpoint)
// are required: ParseNormctlCommandLine refused their absence.
int RunImportCheckpoint(NormdClient& client) {
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const std::string path = absl::GetFlag(FLAGS_input);
  LayerOverrides overrides;
  overrides.cumulative_average = absl::GetFlag(FLAGS_cumulative_average);
  auto momentum = OptionalNumber(FLAGS_momentum, "--momentum");
  if (!momentum.ok()) return FailLocal(momentum.status());
  overrides.momentum = *momentum;
  auto eps = OptionalNumber(FLAGS_eps, "--eps");
  if (!eps.ok()) return FailLocal(eps.status());
  overrides.eps = *eps;
  absl::StatusOr<std::vector<CheckpointLayer>> layers =
      ReadCheckpoint(path, absl::GetFlag(FLAGS_max_header_bytes));
  if (!layers.ok()) return FailLocal(layers.status());
  absl::StatusOr<v1::CreateModelsResponse> created =
      client.CreateModels(CreateModelsFor(*layers, prefix, overrides));
  if (!created.ok()) return Fail(created.status());
  if (Json()) {
    PrintJson(*created);
    return kExitOk;
  }
  std::cout << absl::StrFormat("created %d models from %s\n",
                               created->models_size(), path);
  std::vector<std::vector<std::string>> rows = {ModelHeader()};
  for (const v1::ModelState& m : created->models()) {
    rows.push_back(ModelRow(m));
  }
  PrintTable(rows);
  return kExitOk;
}

int RunExportCheckpoint(NormdClient& client) {
  const std::string prefix = absl::GetFlag(FLAGS_prefix);
  const std::string path = absl::GetFlag(FLAGS_output);
  if (!absl::EndsWith(path, ".safetensors")) {
    return FailLocal(absl::InvalidArgumentError(
        absl::StrCat("--output: '", path,
                     "' must name a .safetensors file (the format written)")));
  }
  // Routed to the replica that holds the prefix's group.
  absl::StatusOr<v1::ListModelsResponse> list =
      client.ListModels(ModelGroupOf(prefix));
  if (!list.ok()) return Fail(list.status());
  std::vector<v1::ModelState> models;
  for (const v1::ModelState& listed : list->models()) {
    if (listed.name() != prefix &&
        !absl::StartsWith(listed.name(), prefix + ".")) {
      continue;
    }
    absl::StatusOr<v1::ModelState> model = client.GetModel(listed.name());
    if (!model.ok()) return Fail(model.status());
    models.push_back(*std::move(model));
  }
  if (models.empty()) {
    return Fail(absl::NotFoundError(absl::StrCat("--prefix: no model is named ",
                                                 prefix, " or ", prefix,
                                                 ".<layer> on this server")));
  }
  absl::StatusOr<std::vector<SafetensorsOutput>> tensors =
      StateDictOf(models, prefix);
  if (!tensors.ok()) return Fail(tensors.status());
  absl::StatusOr<std::string> bytes = EncodeSafetensors(*tensors);
  if (!bytes.ok()) return Fail(bytes.status());
  if (absl::Status s = WriteFileAtomically(path, *bytes); !s.ok()) {
    return FailLocal(s);
  }
  if (Json()) {
    std::cout << "{\"output\": " << JsonString(path)
              << ", \"models\": " << models.size()
              << ", \"tensors\": " << tensors->size()
              << ", \"bytes\": " << bytes->size() << "}\n";
  } else {
    std::cout << absl::StrFormat(
        "wrote %d models (%d tensors, %d bytes) to %s\n", models.size(),
        tensors->size(), bytes->size(), path);
  }
  return kExitOk;
}

int RunHealth(NormdClient& client) {
  auto status = client.Health(absl::GetFlag(FLAGS_service));
  if (!status.ok()) return Fail(status.status());
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*status);
  if (Json()) {
    std::cout << "{\"status\": " << JsonString(name) << "}\n";
  } else {
    std::cout << name << "\n";
  }
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

// The state --state_file or --from names; `command` is "import" or "merge".
absl::StatusOr<v1::ModelState> SourceState(const ClientOptions& options,
                                           absl::string_view command) {
  const std::string file = absl::GetFlag(FLAGS_state_file);
  const std::string from = absl::GetFlag(FLAGS_from);
  if (file.empty() == from.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(command, ": give exactly one of --state_file and --from"));
  }
  if (!from.empty()) {
    std::string name = absl::GetFlag(FLAGS_from_model);
    if (name.empty()) name = absl::GetFlag(FLAGS_model);
    if (name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(command, " --from: needs --model or --from_model"));
    }
    std::unique_ptr<NormdClient> source = NormdClient::Connect(from, options);
    if (absl::Status s =
            source->WaitForConnection(absl::GetFlag(FLAGS_connect_timeout));
        !s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("cannot reach --from ", from, " (", s.message(), ")"));
    }
    absl::StatusOr<v1::ModelState> state = source->ExportModel(name);
    if (!state.ok()) {
      return absl::Status(
          state.status().code(),
          absl::StrCat("--from ", from, ": ", state.status().message()));
    }
    return state;
  }
  absl::StatusOr<std::string> text =
      file == "-" ? std::string(std::istreambuf_iterator<char>(std::cin), {})
                  : ReadFile(file);
  if (!text.ok()) {  // A local problem: bad usage, not a server error.
    return absl::InvalidArgumentError(
        absl::StrCat("--state_file: ", text.status().message()));
  }
  v1::ModelState state;
  google::protobuf::util::JsonParseOptions parse;
  if (auto s =
          google::protobuf::util::JsonStringToMessage(*text, &state, parse);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state_file ", file, ": not a model state (", s.ToString(), ")"));
  }
  return state;
}

int RunExport(NormdClient& client) {
  absl::StatusOr<v1::ModelState> state =
      client.ExportModel(absl::GetFlag(FLAGS_model));
  if (!state.ok()) return Fail(state.status());
  const std::string json = ToJson(*state, /*all_fields=*/true);
  const std::string file = absl::GetFlag(FLAGS_state_file);
  if (file.empty() || file == "-") {
    std::cout << json;
    return kExitOk;
  }
  if (absl::Status s = WriteFile(file, json); !s.ok()) {
    return FailLocal(s);
  }
  if (!Json()) {
    std::cerr << "exported " << state->name() << " (generation "
              << state->generation() << ") to " << file << "\n";
  }
  return kExitOk;
}

int RunImportOrMerge(NormdClient& client, const ClientOptions& options,
                     absl::string_view command) {
  absl::StatusOr<v1::ModelState> state = SourceState(options, command);
  if (!state.ok()) {
    switch (state.status().code()) {
      case absl::StatusCode::kInvalidArgument:
        return FailLocal(state.status());
      case absl::StatusCode::kUnavailable:
        return Fail(state.status(), kExitUnreachable);
      default:
        return Fail(state.status());
    }
  }
  absl::StatusOr<v1::ModelState> model;
  if (command == "import") {
    v1::ImportModelRequest request;
    *request.mutable_model() = *std::move(state);
    request.set_name(absl::GetFlag(FLAGS_model));
    request.set_create_only(absl::GetFlag(FLAGS_create_only));
    model = client.ImportModel(request);
  } else {
    // --model is required by merge (ParseNormctlCommandLine).
    model = client.MergeModel(absl::GetFlag(FLAGS_model), *state);
  }
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return kExitOk;
}

// TLS credentials and the bearer token from the flags.
absl::Status ApplySecurityFlags(ClientOptions& options) {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  if (ca.empty() && (!cert.empty() || !key.empty())) {
    return absl::InvalidArgumentError(
        "--tls_cert/--tls_key need --tls_ca (the CA that signed the server)");
  }
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError("give both --tls_cert and --tls_key");
  }
  if (!ca.empty()) {
    grpc::SslCredentialsOptions ssl;
    for (const auto& [path, field] : {std::pair{&ca, &ssl.pem_root_certs},
                                      std::pair{&cert, &ssl.pem_cert_chain},
                                      std::pair{&key, &ssl.pem_private_key}}) {
      if (path->empty()) continue;
      absl::StatusOr<std::string> pem = ReadFile(*path);
      if (!pem.ok()) return pem.status();
      *field = *pem;
    }
    options.credentials = grpc::SslCredentials(ssl);
  }
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(file);
    if (!token.ok()) return token.status();
    options.bearer_token = std::string(absl::StripAsciiWhitespace(*token));
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  // `normctl COMMAND --help` (or `normctl help COMMAND`): that command only.
  const Command* asked = nullptr;
  bool help = false;
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "-help") {
      help = true;
    } else if (!absl::StartsWith(arg, "-") && asked == nullptr) {
      asked = FindCommand(arg);
      if (arg == "help") {
        help = true;
        if (i + 1 < argc) asked = FindCommand(argv[i + 1]);
      }
    }
  }
  if (help && asked != nullptr) {
    std::cout << CommandHelp(*asked);
    return kExitOk;
  }
  // `normctl --help`, `-h` or `help`: the commands, not every flag.
  if (help) {
    std::cout << "normctl: " << Usage()
              << "\n\nRun `normctl COMMAND --help` for a command's flags.\n";
    return kExitOk;
  }
  // Every usage error is found here, before any network.
  absl::StatusOr<CommandLine> line = ParseNormctlCommandLine(argc, argv);
  if (!line.ok()) {
    if (Json()) return FailLocal(line.status());
    std::cerr << "normctl: " << line.status().message()
              << "\nRun `normctl --help` for the commands.\n";
    return kExitUsage;
  }
  const std::string command = line->command->name;
  ClientOptions options;
  options.timeout = absl::GetFlag(FLAGS_timeout);
  if (const int64_t max_bytes = absl::GetFlag(FLAGS_max_message_bytes);
      max_bytes < 1 || max_bytes > std::numeric_limits<int>::max()) {
    return FailLocal(absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes: ", max_bytes, " is outside [1, 2147483647]")));
  } else {
    options.max_message_bytes = static_cast<int>(max_bytes);
  }
  if (absl::Status s = ApplySecurityFlags(options); !s.ok()) {
    return FailLocal(s);
  }
  const std::string server = absl::GetFlag(FLAGS_server);
  std::unique_ptr<NormdClient> client = NormdClient::Connect(server, options);
  if (absl::Status s =
          client->WaitForConnection(absl::GetFlag(FLAGS_connect_timeout));
      !s.ok()) {
    return Fail(absl::UnavailableError(
                    absl::StrCat("cannot reach ", server, ": ", s.message())),
                kExitUnreachable);
  }
  if (command == "normalize") return RunNormalize(*client);
  if (command == "fit") return RunFit(*client, options.timeout);
  if (command == "create") return RunCreate(*client);
  if (command == "list") return RunList(*client);
  if (command == "drift") return RunDrift(*client);
  if (command == "set-reference" || command == "clear-reference") {
    return RunReference(*client, command);
  }
  if (command == "import-checkpoint") return RunImportCheckpoint(*client);
  if (command == "export-checkpoint") return RunExportCheckpoint(*client);
  if (command == "health") return RunHealth(*client);
  if (command == "export") return RunExport(*client);
  if (command == "import" || command == "merge") {
    return RunImportOrMerge(*client, options, command);
  }
  return RunModelCommand(*client, command);
}

}  // namespace
}  // namespace normd::client

int main(int argc, char** argv) { return normd::client::Main(argc, argv); }

// normctl: command-line client for normd. Run `normctl --help`.
#include <google/protobuf/util/json_util.h>

#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/tensor_io.h"

ABSL_FLAG(std::string, server, "localhost:50051", "normd address host:port.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(30), "Per-call deadline.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle to verify a TLS server with (turns TLS on).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate for mTLS (with --tls_key and --tls_ca).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, token_file, "",
          "File holding the server's bearer token (its --auth_token_file).");
ABSL_FLAG(std::string, output, "text", "Output format: text or json.");
ABSL_FLAG(std::string, model, "",
          "Model name (normalize --mode=batch_norm, fit, create, get, delete, "
          "reset).");
ABSL_FLAG(std::string, mode, "layer_norm",
          "normalize: layer_norm or batch_norm.");
ABSL_FLAG(bool, training, false,
          "normalize --mode=batch_norm: use the batch's statistics and update "
          "the model (PyTorch train()).");
ABSL_FLAG(std::string, shape, "", "Input shape, e.g. 2,3.");
ABSL_FLAG(std::string, values, "",
          "Input values, row-major, e.g. 1,2,3,4,5,6.");
ABSL_FLAG(std::string, input_file, "",
          "Input as a raw little-endian file of --dtype elements (instead of "
          "--values).");
ABSL_FLAG(std::string, output_file, "",
          "normalize: also write the output's raw little-endian bytes here.");
ABSL_FLAG(std::string, dtype, "float32", "Element type: float32 or float64.");
ABSL_FLAG(std::string, channel_axis, "",
          "BatchNorm channel axis (default 1; -1 = channels-last).");
ABSL_FLAG(int, normalized_ndim, 1,
          "LayerNorm: number of trailing dims normalized together.");
ABSL_FLAG(std::string, eps, "", "eps (default: model's / 1e-5).");
ABSL_FLAG(std::string, weight, "",
          "normalize: affine weight values; create: initial weight.");
ABSL_FLAG(std::string, bias, "",
          "normalize: affine bias values; create: initial bias.");
ABSL_FLAG(int64_t, num_features, 0, "create: number of channels C.");
ABSL_FLAG(std::string, momentum, "",
          "create: momentum in [0,1] (default 0.1).");
ABSL_FLAG(bool, cumulative_average, false,
          "create: cumulative moving average (PyTorch momentum=None).");
ABSL_FLAG(std::string, running_mean, "", "create: initial running_mean.");
ABSL_FLAG(std::string, running_var, "", "create: initial running_var.");
ABSL_FLAG(int64_t, num_batches_tracked, 0, "create: initial counter.");
ABSL_FLAG(bool, use_pooled_statistics, false,
          "create: eval uses the exact pooled statistics.");
ABSL_FLAG(std::string, service, "",
          "health: service name (\"\" = server, normd.v1.Normalizer).");
ABSL_FLAG(std::string, request_id, "", "Request id echoed by the server.");

namespace normd::client {
namespace {

constexpr char kUsage[] =
    "command-line client for the normd tensor normalization server.\n"
    "\n"
    "Usage: normctl [--server=host:port] COMMAND [flags]\n"
    "\n"
    "Commands:\n"
    "  normalize  --shape=2,3 --values=1,2,3,4,5,6 [--mode=layer_norm|"
    "batch_norm]\n"
    "             [--model=NAME] [--training] [--channel_axis=N] "
    "[--normalized_ndim=K]\n"
    "             [--eps=E] [--weight=..] [--bias=..] [--input_file=F "
    "--dtype=float32]\n"
    "  fit        --model=NAME --shape=.. --values=..|--input_file=F "
    "[--channel_axis=N]\n"
    "  create     --model=NAME --num_features=C [--momentum=M | "
    "--cumulative_average]\n"
    "             [--eps=E] [--running_mean=..] [--running_var=..] "
    "[--weight=..] [--bias=..]\n"
    "             [--num_batches_tracked=N] [--use_pooled_statistics]\n"
    "  get        --model=NAME\n"
    "  list\n"
    "  delete     --model=NAME\n"
    "  reset      --model=NAME\n"
    "  health     [--service=normd.v1.Normalizer]\n"
    "\n"
    "Exit status: 0 on success, 1 on a server error (its gRPC code and message "
    "are printed), 2 on bad usage.";

bool IsNormctlFlagFile(absl::string_view file) {
  return absl::StrContains(file, "client/normctl.cc");
}

// Usage errors exit 2; server errors exit 1.
int Fail(const absl::Status& status, int code = 1) {
  std::cerr << "normctl: " << absl::StatusCodeToString(status.code()) << ": "
            << status.message() << "\n";
  return code;
}

bool Json() { return absl::GetFlag(FLAGS_output) == "json"; }

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::cout << json;
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

// The input tensor from --shape with --values or --input_file.
absl::StatusOr<v1::Tensor> InputTensor() {
  absl::StatusOr<v1::DataType> dtype =
      ParseDataType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  if (absl::GetFlag(FLAGS_shape).empty()) {
    return absl::InvalidArgumentError("--shape: required, e.g. --shape=2,3");
  }
  absl::StatusOr<std::vector<int64_t>> shape =
      ParseShape(absl::GetFlag(FLAGS_shape), "--shape");
  if (!shape.ok()) return shape.status();
  const std::string file = absl::GetFlag(FLAGS_input_file);
  if (!file.empty()) {
    absl::StatusOr<std::string> bytes = ReadFile(file);
    if (!bytes.ok()) return bytes.status();
    return MakeRawTensor(*shape, *std::move(bytes), *dtype);
  }
  absl::StatusOr<std::vector<double>> values =
      ParseValues(absl::GetFlag(FLAGS_values), "--values");
  if (!values.ok()) return values.status();
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
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "layer_norm" || mode == "LAYER_NORM") {
    request.set_mode(v1::LAYER_NORM);
  } else if (mode == "batch_norm" || mode == "BATCH_NORM") {
    request.set_mode(v1::BATCH_NORM);
  } else {
    return Fail(
        absl::InvalidArgumentError("--mode: expected layer_norm or batch_norm"),
        2);
  }
  absl::StatusOr<v1::Tensor> input = InputTensor();
  if (!input.ok()) return Fail(input.status(), 2);
  *request.mutable_input() = *std::move(input);
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_training(absl::GetFlag(FLAGS_training));
  request.set_normalized_ndim(absl::GetFlag(FLAGS_normalized_ndim));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  auto axis = OptionalNumber(FLAGS_channel_axis, "--channel_axis");
  if (!axis.ok()) return Fail(axis.status(), 2);
  if (axis->has_value()) request.set_channel_axis(static_cast<int>(**axis));
  auto eps = OptionalNumber(FLAGS_eps, "--eps");
  if (!eps.ok()) return Fail(eps.status(), 2);
  if (eps->has_value()) request.set_eps(**eps);
  if (absl::Status s =
          AffineTensor(absl::GetFlag(FLAGS_weight), "--weight", request,
                       &v1::NormalizeRequest::mutable_weight);
      !s.ok()) {
    return Fail(s, 2);
  }
  if (absl::Status s =
          AffineTensor(absl::GetFlag(FLAGS_bias), "--bias", request,
                       &v1::NormalizeRequest::mutable_bias);
      !s.ok()) {
    return Fail(s, 2);
  }

  absl::StatusOr<v1::NormalizeResponse> response = client.Normalize(request);
  if (!response.ok()) return Fail(response.status());
  const std::string out_file = absl::GetFlag(FLAGS_output_file);
  if (!out_file.empty()) {
    if (absl::Status s = WriteFile(out_file, response->output().data());
        !s.ok()) {
      return Fail(s);
    }
  }
  if (Json()) {
    PrintJson(*response);
    return 0;
  }
  std::string shape = absl::StrJoin(response->output().shape(), ",");
  std::cout << absl::StrFormat(
      "output %s [%s]:\n%s\n",
      v1::DataType_Name(response->output().dtype() == v1::DATA_TYPE_UNSPECIFIED
                            ? v1::FLOAT32
                            : response->output().dtype()),
      shape, FormatTensor(response->output()));
  if (response->has_model()) PrintModel(response->model());
  return 0;
}

int RunFit(NormdClient& client) {
  v1::FitRequest request;
  request.set_model(absl::GetFlag(FLAGS_model));
  request.set_request_id(absl::GetFlag(FLAGS_request_id));
  absl::StatusOr<v1::Tensor> input = InputTensor();
  if (!input.ok()) return Fail(input.status(), 2);
  *request.mutable_input() = *std::move(input);
  auto axis = OptionalNumber(FLAGS_channel_axis, "--channel_axis");
  if (!axis.ok()) return Fail(axis.status(), 2);
  if (axis->has_value()) request.set_channel_axis(static_cast<int>(**axis));
  absl::StatusOr<v1::FitResponse> response = client.Fit(request);
  if (!response.ok()) return Fail(response.status());
  if (Json()) {
    PrintJson(*response);
  } else {
    PrintModel(response->model());
  }
  return 0;
}

int RunCreate(NormdClient& client) {
  v1::CreateModelRequest request;
  request.set_name(absl::GetFlag(FLAGS_model));
  request.set_num_features(absl::GetFlag(FLAGS_num_features));
  request.set_cumulative_average(absl::GetFlag(FLAGS_cumulative_average));
  request.set_num_batches_tracked(absl::GetFlag(FLAGS_num_batches_tracked));
  request.set_use_pooled_statistics(absl::GetFlag(FLAGS_use_pooled_statistics));
  auto momentum = OptionalNumber(FLAGS_momentum, "--momentum");
  if (!momentum.ok()) return Fail(momentum.status(), 2);
  if (momentum->has_value()) request.set_momentum(**momentum);
  auto eps = OptionalNumber(FLAGS_eps, "--eps");
  if (!eps.ok()) return Fail(eps.status(), 2);
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
    if (!values.ok()) return Fail(values.status(), 2);
    field->Assign(values->begin(), values->end());
  }
  absl::StatusOr<v1::ModelState> model = client.CreateModel(request);
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return 0;
}

int RunModelCommand(NormdClient& client, absl::string_view command) {
  const std::string name = absl::GetFlag(FLAGS_model);
  if (command == "delete") {
    absl::Status status = client.DeleteModel(name);
    if (!status.ok()) return Fail(status);
    std::cout << "deleted " << name << "\n";
    return 0;
  }
  absl::StatusOr<v1::ModelState> model =
      command == "get" ? client.GetModel(name) : client.ResetModel(name);
  if (!model.ok()) return Fail(model.status());
  Json() ? PrintJson(*model) : PrintModel(*model);
  return 0;
}

int RunList(NormdClient& client) {
  absl::StatusOr<v1::ListModelsResponse> list = client.ListModels();
  if (!list.ok()) return Fail(list.status());
  if (Json()) {
    PrintJson(*list);
    return 0;
  }
  std::cout << absl::StrFormat("%-32s %8s %12s %12s %10s\n", "NAME", "C",
                               "BATCHES", "SAMPLES", "GENERATION");
  for (const v1::ModelState& m : list->models()) {
    std::cout << absl::StrFormat("%-32s %8d %12d %12d %10d\n", m.name(),
                                 m.num_features(), m.num_batches_tracked(),
                                 m.sample_count(), m.generation());
  }
  return 0;
}

int RunHealth(NormdClient& client) {
  auto status = client.Health(absl::GetFlag(FLAGS_service));
  if (!status.ok()) return Fail(status.status());
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                   *status)
            << "\n";
  return *status == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
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
  absl::SetProgramUsageMessage(kUsage);
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = IsNormctlFlagFile;
  usage_config.contains_helpshort_flags = IsNormctlFlagFile;
  absl::SetFlagsUsageConfig(usage_config);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::cerr << kUsage << "\n";
    return 2;
  }
  const std::string command = args[1];
  ClientOptions options;
  options.timeout = absl::GetFlag(FLAGS_timeout);
  if (absl::Status s = ApplySecurityFlags(options); !s.ok()) {
    std::cerr << "normctl: " << s.message() << "\n";
    return 2;
  }
  std::unique_ptr<NormdClient> client =
      NormdClient::Connect(absl::GetFlag(FLAGS_server), options);
  if (command == "normalize") return RunNormalize(*client);
  if (command == "fit") return RunFit(*client);
  if (command == "create") return RunCreate(*client);
  if (command == "get" || command == "delete" || command == "reset") {
    return RunModelCommand(*client, command);
  }
  if (command == "list") return RunList(*client);
  if (command == "health") return RunHealth(*client);
  std::cerr << "normctl: unknown command '" << command << "'\n\n"
            << kUsage << "\n";
  return 2;
}

}  // namespace
}  // namespace normd::client

int main(int argc, char** argv) { return normd::client::Main(argc, argv); }

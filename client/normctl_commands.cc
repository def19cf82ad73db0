#include "client/normctl_commands.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace normd::client {
namespace {

// The input flags normalize and fit share.
constexpr CommandFlag kInputFlags[] = {
    {"shape", "Input shape, e.g. 2,3 (with --values or --input_file)."},
    {"values", "Input values, row-major, e.g. 1,2,3,4,5,6."},
    {"input_file",
     "Input as a raw little-endian file of --dtype elements (instead of "
     "--values)."},
    {"dtype",
     "Element type of --values / --input_file: float32, float64, bfloat16 "
     "or float16."},
};

std::vector<CommandFlag> With(std::vector<CommandFlag> own,
                              bool with_input_flags) {
  if (with_input_flags) {
    own.insert(own.end(), std::begin(kInputFlags), std::end(kInputFlags));
  }
  return own;
}

constexpr CommandFlag kCommonFlags[] = {
    {"server", "normd address host:port."},
    {"timeout", "Per-call deadline."},
    {"connect_timeout",
     "How long to wait for a server that does not answer; a refused "
     "connection fails at once. Either way normctl exits 3."},
    {"max_message_bytes",
     "Largest message normctl sends or accepts, in bytes (at most "
     "2147483647). Raise it with the server's --max_message_bytes to send "
     "tensors of 64 MiB or more."},
    {"json",
     "Print the reply as JSON (numbers as numbers: shapes, counts, tensor "
     "data), and errors on stderr as {\"code\", \"message\"}."},
    {"tls_ca", "PEM CA bundle to verify a TLS server with (turns TLS on)."},
    {"tls_cert",
     "PEM client certificate for mTLS (with --tls_key and --tls_ca)."},
    {"tls_key", "PEM private key of --tls_cert."},
    {"token_file",
     "File holding the server's bearer token (its --auth_token_file)."},
};

// Edit distance with adjacent transpositions (--modle is one edit from
// --model), for "did you mean".
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1,
                                     std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[a.size()][b.size()];
}

// Every flag name some command or every command takes.
std::vector<std::string> KnownFlags() {
  std::vector<std::string> names;
  for (const CommandFlag& f : kCommonFlags) names.push_back(f.name);
  for (const Command& c : Commands()) {
    for (const CommandFlag& f : c.flags) names.push_back(f.name);
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool Takes(const Command& command, absl::string_view flag) {
  for (const CommandFlag& f : kCommonFlags) {
    if (f.name == flag) return true;
  }
  for (const CommandFlag& f : command.flags) {
    if (f.name == flag) return true;
  }
  return false;
}

// `command` (when known) is searched first: its flags and the common ones
// win a tie against another command's.
std::string UnknownFlagMessage(absl::string_view name, const Command* command) {
  std::string best;
  size_t best_distance = 3;  // Suggest only close names.
  auto consider = [&](absl::string_view known) {
    if (size_t d = EditDistance(name, known); d < best_distance) {
      best_distance = d;
      best = std::string(known);
    }
  };
  if (command != nullptr) {
    for (const CommandFlag& f : kCommonFlags) consider(f.name);
    for (const CommandFlag& f : command->flags) consider(f.name);
  }
  for (const std::string& known : KnownFlags()) consider(known);
  return absl::StrCat(
      "--", name, ": unknown flag",
      best.empty() ? "" : absl::StrCat(" (did you mean --", best, "?)"),
      "; `normctl COMMAND --help` lists a command's flags");
}

void AppendFlagHelp(const CommandFlag& f, std::string& out) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(f.name);
  const std::string default_value =
      flag == nullptr || flag->DefaultValue().empty() ? "\"\""
                                                      : flag->DefaultValue();
  absl::StrAppendFormat(&out, "  --%s (default: %s)\n      %s\n", f.name,
                        default_value, f.help);
}

}  // namespace

const std::vector<Command>& Commands() {
  static const auto* commands = new std::vector<Command>{
      {"normalize",
       "--input=x.npy [--output=y.npy] | --shape=2,3 --values=1,2,3,4,5,6",
       "LayerNorm (default), BatchNorm, GroupNorm, InstanceNorm, RMSNorm, L2 "
       "or weight norm of a tensor. With --output the result goes to a .npy "
       "file, else it is printed.",
       With({{"input",
              "The input tensor from a .npy file (float32, float64 or "
              "float16, C order; shape and dtype from the file)."},
             {"output", "Write the output tensor to this .npy file."},
             {"output_file",
              "Also write the output's raw little-endian bytes here."},
             {"mode",
              "layer_norm, batch_norm, group_norm, instance_norm, rms_norm, "
              "l2_norm (F.normalize over the trailing --normalized_ndim "
              "dims) or weight_norm (torch weight_norm of the input v at "
              "--channel_axis, default 0, with --weight as g)."},
             {"model",
              "--mode=batch_norm (required there), or instance_norm: the "
              "model whose statistics are used."},
             {"training",
              "batch_norm, or instance_norm with --model: use the batch's "
              "statistics and update the model (PyTorch train())."},
             {"channel_axis",
              "batch_norm / group_norm / instance_norm channel axis (default "
              "1; -1 = channels-last); weight_norm: PyTorch's dim (default "
              "0)."},
             {"normalized_ndim",
              "layer_norm / rms_norm / l2_norm: number of trailing dims "
              "normalized together."},
             {"num_groups", "group_norm: number of groups (divides C)."},
             {"layer_norm_style",
              "layer_norm: pytorch, or bert (unbiased std + eps outside the "
              "root, eps default 1e-6)."},
             {"eps",
              "eps (default: the model's; 1e-5; l2_norm 1e-12; weight_norm "
              "has none)."},
             {"weight",
              "Affine weight values, one per normalized element or channel "
              "(weight_norm: g, one per slice)."},
             {"bias", "Affine bias values."},
             {"request_id", "Request id echoed by the server."}},
            true),
       {},
       {"input", "input_file", "values"}},
      {"fit",
       "--model=NAME --input=big.npy | --shape=.. --values=..",
       "Folds a batch into a BatchNorm model's statistics (creating it). "
       "--input streams the file over one FitStream in --chunk_bytes "
       "messages, each one Fit step, with a progress bar.",
       With({{"model", "The model to fit (created on its first Fit)."},
             {"input",
              "The batch from a .npy file of any size (float32, float64 or "
              "float16, C order), streamed in --chunk_bytes pieces."},
             {"chunk_bytes",
              "--input: bytes of input per FitStream message (whole rows "
              "along the first dim); each message is one Fit step."},
             {"progress",
              "--input: progress bar on stderr: auto (when stderr is a "
              "terminal), always or never."},
             {"channel_axis",
              "The channel axis (default 1; -1 = channels-last)."},
             {"request_id", "Request id echoed by the server."}},
            true),
       {"model"},
       {"input", "input_file", "values"}},
      {"create",
       "--model=NAME --num_features=C",
       "Creates a model, optionally with PyTorch statistics.",
       {{"model", "The new model's name."},
        {"num_features", "Number of channels C."},
        {"momentum", "Momentum in [0,1] (default 0.1)."},
        {"cumulative_average",
         "Cumulative moving average (PyTorch momentum=None)."},
        {"eps", "eps (default 1e-5)."},
        {"running_mean", "Initial running_mean, C values."},
        {"running_var", "Initial running_var, C values."},
        {"weight", "Initial affine weight, C values."},
        {"bias", "Initial affine bias, C values."},
        {"num_batches_tracked", "Initial num_batches_tracked."},
        {"use_pooled_statistics",
         "Eval uses the exact pooled statistics instead of the running "
         "ones."}},
       {"model", "num_features"},
       {}},
      {"get",
       "--model=NAME",
       "Prints a model's configuration and statistics.",
       {{"model", "The model."}},
       {"model"},
       {}},
      {"list",
       "[--group=G]",
       "Lists the models as a table (no per-channel arrays). Behind a "
       "sharding proxy, --group lists the replica that holds group G (the "
       "names G and G.*) and is routed to it.",
       {{"group",
         "Only the models of this group: the name G and the names G.<rest>. "
         "A group is a model name up to its first '.'."}},
       {},
       {}},
      {"delete",
       "--model=NAME",
       "Deletes a model.",
       {{"model", "The model."}},
       {"model"},
       {}},
      {"reset",
       "--model=NAME",
       "Resets a model's statistics and counts (configuration, weight and "
       "bias kept).",
       {{"model", "The model."}},
       {"model"},
       {}},
      {"drift",
       "[--model=NAME]",
       "Input drift against each model's reference statistics, over the "
       "server's observation window (--drift_buckets x "
       "--drift_bucket_seconds). Without --model: every model with a "
       "reference, the largest kl_max first (\"-\": fewer samples than "
       "--drift_min_samples yet). With --model: its summary and its ten "
       "worst channels by kl.",
       {{"model", "Only this model, with its worst channels."}},
       {},
       {}},
      {"set-reference",
       "--model=NAME --from=running|pooled",
       "Sets a model's drift reference to its running statistics or its "
       "exact pooled statistics as they are now (after a recalibration, "
       "say): its inputs are compared with them from then on.",
       {{"model", "The model."},
        {"from", "running or pooled: which of the model's statistics."}},
       {"model", "from"},
       {}},
      {"clear-reference",
       "--model=NAME",
       "Removes a model's drift reference: its inputs are no longer "
       "observed.",
       {{"model", "The model."}},
       {"model"},
       {}},
      {"export",
       "--model=NAME [--state_file=NAME.json]",
       "Writes a model's complete state (configuration, running and pooled "
       "statistics, counts, generation) as JSON, for import or merge here "
       "or on another server.",
       {{"model", "The model."},
        {"state_file",
         "Write the state here (default, or \"-\": standard output)."}},
       {"model"},
       {}},
      {"import",
       "--state_file=NAME.json | --from=HOST:PORT --model=NAME",
       "Creates or replaces a model from an exported state: a file, or "
       "straight from another server. --model renames it.",
       {{"state_file", "Read the state from this file (\"-\" = stdin)."},
        {"from",
         "Take the state from this other normd (host:port; same TLS / token "
         "flags) with ExportModel instead of a file."},
        {"from_model", "--from: the model to take there (default: --model)."},
        {"model", "The name to import under (default: the name in the state)."},
        {"create_only",
         "Fail with ALREADY_EXISTS instead of replacing a model of that "
         "name."}},
       {},
       {"state_file", "from"}},
      {"merge",
       "--model=NAME --state_file=PART.json | --from=HOST:PORT",
       "Folds an exported state into an existing model: pooled statistics "
       "exactly (Chan's formula), counts added, running statistics averaged "
       "by their batch counts; the model's configuration kept.",
       {{"model", "The model to merge into."},
        {"state_file", "Read the state from this file (\"-\" = stdin)."},
        {"from",
         "Take the state from this other normd (host:port; same TLS / token "
         "flags) with ExportModel instead of a file."},
        {"from_model", "--from: the model to take there (default: --model)."}},
       {"model"},
       {"state_file", "from"}},
      {"import-checkpoint",
       "--input=FILE.safetensors|FILE.onnx --prefix=P",
       "Creates one model per BatchNorm layer of a checkpoint, named "
       "P.<layer>, in one CreateModels call: if any layer is invalid or any "
       "name is taken, none is created. A safetensors layer is a group of "
       "tensors <layer>.running_mean, .running_var (and .weight, .bias, "
       ".num_batches_tracked when present); an ONNX layer is a "
       "BatchNormalization node with its initializers, epsilon and momentum. "
       "Every model is in P's group (P up to its first '.'), so a sharding "
       "proxy keeps the checkpoint on one replica.",
       {{"input", "The .safetensors or .onnx file."},
        {"prefix",
         "The models are named PREFIX.<layer> (the layer's PyTorch module "
         "path)."},
        {"momentum",
         "Replace every layer's momentum (default: the file's; an ONNX "
         "node's converted to PyTorch's, 1 - ONNX's)."},
        {"cumulative_average",
         "Every layer uses a cumulative moving average (PyTorch "
         "momentum=None)."},
        {"eps", "Replace every layer's eps (default: the file's)."},
        {"max_header_bytes", "The largest safetensors header read."}},
       {"input", "prefix"},
       {}},
      {"export-checkpoint",
       "--prefix=P --output=FILE.safetensors",
       "Writes every model named P.<layer> as a PyTorch state_dict: "
       "<layer>.running_mean, .running_var, .weight, .bias (float32) and "
       ".num_batches_tracked (int64), atomically (a temporary file renamed "
       "over FILE). Load it with module.load_state_dict("
       "normd.load_safetensors(FILE), strict=False): the Python client "
       "reads the format with numpy alone.",
       {{"prefix", "The models named PREFIX.<layer> are written."},
        {"output", "The .safetensors file to write."}},
       {"prefix", "output"},
       {}},
      {"health",
       "[--service=normd.v1.Normalizer]",
       "Asks grpc.health.v1; exits 0 only when SERVING.",
       {{"service",
         "Service name (\"\" = the server, or normd.v1.Normalizer)."}},
       {},
       {}},
  };
  return *commands;
}

const Command* FindCommand(absl::string_view name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string Usage() {
  std::string out =
      "command-line client for the normd tensor normalization server.\n\n"
      "Usage: normctl [--server=host:port] COMMAND [flags]\n"
      "       normctl COMMAND --help     (that command's flags)\n\n"
      "Commands:\n";
  for (const Command& c : Commands()) {
    absl::StrAppendFormat(&out, "  %-17s %s\n", c.name, c.synopsis);
  }
  absl::StrAppend(&out,
                  "\nExit status: 0 success, 1 server error (its gRPC code and "
                  "message are printed), 2 bad usage or a local file error "
                  "(the file is named), 3 server unreachable.");
  return out;
}

std::string CommandHelp(const Command& c) {
  std::string out = absl::StrCat("Usage: normctl ", c.name, " ", c.synopsis,
                                 "\n\n", c.description, "\n");
  if (!c.flags.empty()) out += "\nFlags:\n";
  for (const CommandFlag& f : c.flags) AppendFlagHelp(f, out);
  out += "\nCommon flags:\n";
  for (const CommandFlag& f : kCommonFlags) AppendFlagHelp(f, out);
  out +=
      "\nExit status: 0 success, 1 server error, 2 bad usage or a local file "
      "error, 3 server unreachable.\n";
  return out;
}

absl::StatusOr<CommandLine> ParseNormctlCommandLine(int argc, char** argv) {
  CommandLine line;
  std::vector<std::string> positional;
  const std::vector<std::string> known = KnownFlags();
  // The command, if named, for suggestions.
  const Command* named = nullptr;
  for (int i = 1; i < argc && named == nullptr; ++i)
    named = FindCommand(argv[i]);
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      positional.emplace_back(arg);
      continue;
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    absl::string_view name = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    }
    bool negated = false;
    if (!std::binary_search(known.begin(), known.end(), name) &&
        absl::StartsWith(name, "no") && !value.has_value()) {
      negated = true;  // --nojson
      name.remove_prefix(2);
    }
    absl::CommandLineFlag* flag =
        std::binary_search(known.begin(), known.end(), name)
            ? absl::FindCommandLineFlag(name)
            : nullptr;
    if (flag == nullptr) {
      return absl::InvalidArgumentError(UnknownFlagMessage(
          negated ? absl::StrCat("no", name) : std::string(name), named));
    }
    const bool is_bool = flag->IsOfType<bool>();
    if (negated && !is_bool) {
      return absl::InvalidArgumentError(
          UnknownFlagMessage(absl::StrCat("no", name), named));
    }
    if (!value.has_value()) {
      if (is_bool) {
        value = negated ? "false" : "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("--", name, ": needs a value (--", name, "=...)"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": bad value '", *value, "' (", error, ")"));
    }
    line.given.emplace_back(name);
  }
  if (positional.empty()) {
    return absl::InvalidArgumentError("no command given");
  }
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "one command at a time; also given: ",
        absl::StrJoin(positional.begin() + 1, positional.end(), " ")));
  }
  line.command = FindCommand(positional[0]);
  if (line.command == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", positional[0], "'"));
  }
  for (const std::string& name : line.given) {
    if (!Takes(*line.command, name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": not a flag of ", line.command->name,
                       " (see normctl ", line.command->name, " --help)"));
    }
  }
  for (const char* name : line.command->required) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || flag->CurrentValue().empty() ||
        std::find(line.given.begin(), line.given.end(), name) ==
            line.given.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", name, ": required by ", line.command->name, " (usage: normctl ",
          line.command->name, " ", line.command->synopsis, ")"));
    }
  }
  const std::vector<const char*>& one_of = line.command->one_of;
  const auto given_count =
      std::count_if(one_of.begin(), one_of.end(), [&](const char* name) {
        return std::find(line.given.begin(), line.given.end(), name) !=
               line.given.end();
      });
  if (!one_of.empty() && given_count != 1) {
    std::vector<std::string> flags;
    for (const char* name : one_of) flags.push_back(absl::StrCat("--", name));
    return absl::InvalidArgumentError(absl::StrCat(
        line.command->name, ": give ", given_count == 0 ? "one" : "only one",
        " of ", absl::StrJoin(flags, ", ")));
  }
  return line;
}

}  // namespace normd::client

// The Open Inference Protocol on the service, without a protocol: the
// parameters KServe and Triton clients send are accepted and change
// nothing, normd's own stay strict, and the repository index, the model
// configuration and the statistics say what is there. Results are checked
// against a hand-worked LayerNorm and against the native call.
#include "server/service/inference.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/testing/service_stack.h"

namespace normd {
namespace {

using testing::ServiceStack;

// A request to run `model` on input [2, 2] = {1, 2, 3, 5} (FP32, raw bytes
// held by `storage`).
InferRequest Request(const std::string& model, std::vector<float>& storage) {
  storage = {1, 2, 3, 5};
  InferRequest request;
  request.model_name = model;
  InferInput& input = request.inputs.emplace_back();
  input.name = "input";
  input.datatype = "FP32";
  input.shape = {2, 2};
  input.data.contiguous = absl::string_view(
      reinterpret_cast<const char*>(storage.data()), storage.size() * 4);
  input.data_field = "raw_input_contents[0]";
  return request;
}

// Runs `request`, the output into `out`.
absl::StatusOr<InferReply> RunInfer(Inference& inference,
                                    const InferRequest& request,
                                    std::vector<float>& out) {
  return inference.Infer(
      request,
      [&](const InferOutputPlan& plan) -> absl::StatusOr<OutputPlacement> {
        out.resize(static_cast<size_t>(plan.elements));
        return OutputPlacement{.data = out.data(), .reply = ReplySize{}};
      });
}

TEST(InferenceTest, ClientsStandardParametersAreAcceptedAndIgnored) {
  ServiceStack stack;
  std::vector<float> bytes, plain, tolerated;
  ASSERT_TRUE(
      RunInfer(stack.inference, Request("layer_norm", bytes), plain).ok());
  // Hand-worked row [1, 2]: mean 1.5, variance 0.25: +-0.5/sqrt(0.25+1e-5).
  EXPECT_NEAR(plain[0], -0.5 / std::sqrt(0.25 + 1e-5), 1e-6);
  InferRequest request = Request("layer_norm", bytes);
  request.parameters = {
      {"timeout", int64_t{100}},         {"priority", int64_t{2}},
      {"sequence_id", std::string("s")}, {"sequence_start", true},
      {"sequence_end", false},           {"binary_data_output", true}};
  request.inputs[0].parameters = {{"content_type", std::string("tensor")},
                                  {"binary_data_size", int64_t{16}}};
  request.outputs.push_back({"output", {{"binary_data", true}}});
  ASSERT_TRUE(RunInfer(stack.inference, request, tolerated).ok());
  EXPECT_EQ(tolerated, plain);
}

TEST(InferenceTest, NormdsOwnParametersStayStrict) {
  ServiceStack stack;
  std::vector<float> bytes, out;
  const struct {
    InferParameters request;
    InferParameters output;
    const char* message;
  } cases[] = {
      {{{"epsilon", 1e-3}}, {}, "parameters: unknown parameter \"epsilon\""},
      {{{"eps", true}}, {}, "parameters.eps: must be a double"},
      {{{"eps", std::monostate()}}, {}, "got no value"},
      {{},
       {{"classification", int64_t{3}}},
       "outputs[0].parameters.classification: not supported"},
      {{},
       {{"top_k", int64_t{3}}},
       "outputs[0].parameters: unknown output parameter \"top_k\""},
      // Of several problems the one with the first name is reported.
      {{{"zeta", 1.0}, {"alpha", 1.0}}, {}, "unknown parameter \"alpha\""},
  };
  for (const auto& c : cases) {
    InferRequest request = Request("layer_norm", bytes);
    request.parameters = c.request;
    if (!c.output.empty()) request.outputs.push_back({"output", c.output});
    const absl::StatusOr<InferReply> reply =
        RunInfer(stack.inference, request, out);
    EXPECT_EQ(reply.status().code(), absl::StatusCode::kInvalidArgument)
        << c.message;
    EXPECT_NE(reply.status().message().find(c.message), absl::string_view::npos)
        << reply.status();
  }
  // An input parameter normd does not know.
  InferRequest request = Request("layer_norm", bytes);
  request.inputs[0].parameters = {{"shm_region", std::string("x")}};
  EXPECT_NE(RunInfer(stack.inference, request, out)
                .status()
                .message()
                .find("inputs[0].parameters: unknown tensor parameter "
                      "\"shm_region\""),
            absl::string_view::npos);
  // A byte count that is not the shape's names where the bytes came from.
  request = Request("layer_norm", bytes);
  request.inputs[0].shape = {2, 3};
  EXPECT_NE(RunInfer(stack.inference, request, out)
                .status()
                .message()
                .find("raw_input_contents[0]: has 16 bytes but shape [2,3] "
                      "of float32 needs 24"),
            absl::string_view::npos);
}

TEST(InferenceTest, IndexConfigAndStatisticsSayWhatIsThere) {
  ServiceStack stack;
  ModelSpec spec;
  spec.name = "bn/a";
  spec.num_features = 2;
  spec.eps = 1e-3;
  spec.momentum = 0.25;
  ASSERT_TRUE(stack.service.CreateModel(spec).ok());
  std::vector<std::string> names;
  for (const OipRepositoryEntry& e : stack.inference.RepositoryIndex()) {
    names.push_back(e.name);
    EXPECT_EQ(e.state, "READY");
    EXPECT_EQ(e.version, "1");
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "layer_norm", "rms_norm", "group_norm", "instance_norm",
                       "l2_norm", "weight_norm", "bn/a"}));
  const absl::StatusOr<OipModelConfig> config =
      stack.inference.ModelConfig("bn/a", "");
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->platform, "normd");
  EXPECT_EQ(config->inputs[0].shape, (std::vector<int64_t>{-1, 2}));
  EXPECT_EQ(config->parameters,
            (std::vector<std::pair<std::string, std::string>>{
                {"num_features", "2"},
                {"eps", "0.001"},
                {"momentum", "0.25"},
                {"use_pooled_statistics", "false"}}));
  EXPECT_EQ(stack.inference.ModelConfig("nope", "").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(stack.inference.ModelConfig("layer_norm", "2").status().code(),
            absl::StatusCode::kNotFound);
  // Two successes and a failure of layer_norm; a call to an unknown model
  // is recorded nowhere.
  std::vector<float> bytes, out;
  ASSERT_TRUE(
      RunInfer(stack.inference, Request("layer_norm", bytes), out).ok());
  ASSERT_TRUE(
      RunInfer(stack.inference, Request("layer_norm", bytes), out).ok());
  InferRequest bad = Request("layer_norm", bytes);
  bad.parameters = {{"nope", true}};
  ASSERT_FALSE(RunInfer(stack.inference, bad, out).ok());
  ASSERT_FALSE(RunInfer(stack.inference, Request("unknown", bytes), out).ok());
  const absl::StatusOr<std::vector<OipModelStatistics>> one =
      stack.inference.Statistics("layer_norm", "");
  ASSERT_TRUE(one.ok());
  ASSERT_EQ(one->size(), 1u);
  EXPECT_EQ((*one)[0].infer.success_count, 2);
  EXPECT_EQ((*one)[0].infer.fail_count, 1);
  EXPECT_GT((*one)[0].infer.success_ns, 0);
  EXPECT_GT((*one)[0].infer.last_inference_ms, 0);
  const absl::StatusOr<std::vector<OipModelStatistics>> all =
      stack.inference.Statistics(std::nullopt, "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 7u);
  EXPECT_EQ(stack.inference.Statistics("unknown", "").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(InferenceTest, ABatchNormModelsReplyCarriesItsCountersUnsigned) {
  ServiceStack stack;
  ModelStateSpec state;
  state.config.name = "old";
  state.config.num_features = 2;
  state.generation = (uint64_t{1} << 63) + 5;  // Past int64.
  ASSERT_TRUE(stack.service.ImportModel(state, "", false).ok());
  std::vector<float> bytes, out;
  const absl::StatusOr<InferReply> reply =
      RunInfer(stack.inference, Request("old", bytes), out);
  ASSERT_TRUE(reply.ok()) << reply.status();
  ASSERT_TRUE(reply->counters.has_value());
  EXPECT_EQ(reply->counters->generation, (uint64_t{1} << 63) + 5);
}

}  // namespace
}  // namespace normd

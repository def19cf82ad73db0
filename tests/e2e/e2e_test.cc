// End-to-end tests against a real normd process on loopback: every RPC,
// every malformed case of docs/api.md with its exact gRPC code (and no state
// change), streams, health, metrics and graceful shutdown.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/tensor_io.h"
#include "tests/testing/reference.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"

namespace normd {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::normd::client::MakeTensor;
using ::normd::client::NormdClient;
using ::normd::client::TensorValues;
using ::normd::testing::MetricValue;
using ::normd::testing::ServerProcess;

constexpr int64_t kMaxMessageBytes = 4 << 20;

class EndToEndTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = new ServerProcess();
    ASSERT_TRUE(server_->Start(
        NORMD_BINARY,
        {"--max_message_bytes=" + std::to_string(kMaxMessageBytes),
         "--max_models=1000"}))
        << server_->log();
    client_ = NormdClient::Connect(server_->target()).release();
  }
  static void TearDownTestSuite() {
    delete client_;
    delete server_;
  }

  // Everything the server holds, serialized: compared before and after a
  // rejected request.
  static std::string StateFingerprint() {
    std::string out;
    auto list = client_->ListModels();
    EXPECT_TRUE(list.ok()) << list.status();
    for (const auto& m : list->models()) {
      auto full = client_->GetModel(m.name());
      EXPECT_TRUE(full.ok());
      out += full->SerializeAsString();
    }
    return out;
  }

  static ServerProcess* server_;
  static NormdClient* client_;
};

ServerProcess* EndToEndTest::server_ = nullptr;
NormdClient* EndToEndTest::client_ = nullptr;

v1::NormalizeRequest LayerNormRequest(const std::vector<int64_t>& shape,
                                      const std::vector<double>& values,
                                      v1::DataType dtype = v1::FLOAT32) {
  v1::NormalizeRequest request;
  request.set_mode(v1::LAYER_NORM);
  *request.mutable_input() = MakeTensor(shape, values, dtype);
  return request;
}

v1::NormalizeRequest BatchNormRequest(const std::string& model, bool training,
                                      const std::vector<int64_t>& shape,
                                      const std::vector<double>& values) {
  v1::NormalizeRequest request;
  request.set_mode(v1::BATCH_NORM);
  request.set_model(model);
  request.set_training(training);
  *request.mutable_input() = MakeTensor(shape, values, v1::FLOAT64);
  return request;
}

v1::FitRequest FitRequest(const std::string& model,
                          const std::vector<int64_t>& shape,
                          const std::vector<double>& values) {
  v1::FitRequest request;
  request.set_model(model);
  *request.mutable_input() = MakeTensor(shape, values, v1::FLOAT64);
  return request;
}

TEST_F(EndToEndTest, HealthIsServingForServerAndService) {
  EXPECT_EQ(*client_->Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ(*client_->Health("normd.v1.Normalizer"),
            HealthCheckResponse::SERVING);
  EXPECT_EQ(client_->Health("no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(EndToEndTest, LayerNormInDataAndValuesForms) {
  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  const auto expected = testing::ReferenceLayerNorm(x, 6, 1e-5, {}, {});
  for (v1::DataType dtype : {v1::FLOAT32, v1::FLOAT64}) {
    auto request = LayerNormRequest({2, 2, 3}, x, dtype);
    request.set_normalized_ndim(2);
    request.set_request_id("ln-1");
    auto response = client_->Normalize(request);
    ASSERT_TRUE(response.ok()) << response.status();
    EXPECT_EQ(response->request_id(), "ln-1");
    EXPECT_EQ(response->output().dtype(), dtype);
    EXPECT_EQ(response->output().values_size(), 0);
    EXPECT_FALSE(response->has_model());
    auto y = TensorValues(response->output());
    ASSERT_TRUE(y.ok());
    // The inputs are exact in both types: fp32 within the kernels' bound
    // (reference.h), fp64 within the fp64 bar.
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR((*y)[i], expected[i],
                  dtype == v1::FLOAT32
                      ? testing::Fp32OutputBound(expected[i], 0.0, 1.0)
                      : 1e-12 * std::max(1.0, std::abs(expected[i])));
    }
  }
  // The values form is answered in the values form.
  v1::NormalizeRequest request;
  request.set_mode(v1::LAYER_NORM);
  request.mutable_input()->add_shape(2);
  request.mutable_input()->add_shape(6);
  for (double v : x) request.mutable_input()->add_values(v);
  auto response = client_->Normalize(request);
  ASSERT_TRUE(response.ok()) << response.status();
  ASSERT_EQ(response->output().values_size(), 12);
  EXPECT_TRUE(response->output().data().empty());
  for (int i = 0; i < 12; ++i) {  // Computed as FLOAT32, the default.
    EXPECT_NEAR(response->output().values(i), expected[i],
                testing::Fp32OutputBound(expected[i], 0.0, 1.0));
  }
  // Zero elements: returned unchanged.
  auto empty = LayerNormRequest({0, 4}, {});
  auto empty_response = client_->Normalize(empty);
  ASSERT_TRUE(empty_response.ok()) << empty_response.status();
  EXPECT_EQ(empty_response->output().shape_size(), 2);
  EXPECT_TRUE(empty_response->output().data().empty());
}

// Requests of 256 KiB and more are computed in the compute arena and
// finished from there; their answers must be the same as everywhere else.
TEST_F(EndToEndTest, LargeRequestsComputedOffTheRpcThreadsAreCorrect) {
  constexpr int64_t kRows = 512, kCols = 512;  // 2 MiB of fp64.
  const std::vector<double> x =
      testing::RandomValues<double>(kRows * kCols, 11, 3.0, 2.0);
  auto request = LayerNormRequest({kRows, kCols}, x, v1::FLOAT64);
  request.set_request_id("big");
  auto response = client_->Normalize(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->request_id(), "big");
  const auto y = TensorValues(response->output());
  ASSERT_TRUE(y.ok());
  const auto expected = testing::ReferenceLayerNorm(x, kCols, 1e-5, {}, {});
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR((*y)[i], expected[i], 1e-10) << i;
  }
  // Fit of the same 1 MiB as [rows, cols] = [N, C]: pooled statistics equal
  // the fp64 reference.
  auto fit = client_->Fit(FitRequest("e2e-big-fit", {kRows, kCols}, x));
  ASSERT_TRUE(fit.ok()) << fit.status();
  const auto stats = testing::ReferenceChannelStats(x, kRows, kCols, 1);
  ASSERT_EQ(fit->model().mean_size(), kCols);
  for (int64_t c = 0; c < kCols; ++c) {
    EXPECT_NEAR(fit->model().mean(c), stats.mean[c], 1e-12);
    EXPECT_NEAR(fit->model().var(c), stats.var[c], 1e-11);
  }
  EXPECT_TRUE(client_->DeleteModel("e2e-big-fit").ok());
}

TEST_F(EndToEndTest, BatchNormTrainEvalAndModelLifecycle) {
  const std::vector<double> x = {1, 2, 3, 6, 5, 10, 7, 14};
  auto trained =
      client_->Normalize(BatchNormRequest("e2e-bn", true, {4, 2}, x));
  ASSERT_TRUE(trained.ok()) << trained.status();
  const v1::ModelState& m = trained->model();
  EXPECT_EQ(m.name(), "e2e-bn");
  EXPECT_EQ(m.num_features(), 2);
  EXPECT_EQ(m.num_batches_tracked(), 1);
  EXPECT_EQ(m.sample_count(), 4);
  EXPECT_NEAR(m.running_mean(0), 0.4, 1e-15);
  EXPECT_NEAR(m.running_var(1), 0.9 + 0.1 * 80.0 / 3.0, 1e-14);
  EXPECT_NEAR(m.mean(1), 8.0, 1e-15);
  EXPECT_NEAR(m.var(0), 5.0, 1e-14);
  auto y = TensorValues(trained->output());
  EXPECT_NEAR((*y)[0], -3.0 / std::sqrt(5.0 + 1e-5), 1e-12);

  // Eval uses the running statistics.
  auto eval = client_->Normalize(BatchNormRequest("e2e-bn", false, {4, 2}, x));
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto ye = TensorValues(eval->output());
  EXPECT_NEAR((*ye)[0], (1 - 0.4) / std::sqrt(m.running_var(0) + 1e-5), 1e-12);
  EXPECT_EQ(eval->model().generation(), m.generation());

  auto got = client_->GetModel("e2e-bn");
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->SerializeAsString(), m.SerializeAsString());

  auto list = client_->ListModels();
  ASSERT_TRUE(list.ok());
  bool found = false;
  for (const auto& model : list->models()) {
    if (model.name() != "e2e-bn") continue;
    found = true;
    EXPECT_EQ(model.running_mean_size(), 0);
    EXPECT_EQ(model.num_batches_tracked(), 1);
  }
  EXPECT_TRUE(found);

  auto reset = client_->ResetModel("e2e-bn");
  ASSERT_TRUE(reset.ok());
  EXPECT_EQ(reset->num_batches_tracked(), 0);
  EXPECT_EQ(reset->sample_count(), 0);
  EXPECT_EQ(reset->running_mean(0), 0.0);
  EXPECT_EQ(reset->running_var(0), 1.0);
  EXPECT_EQ(reset->mean_size(), 0);
  EXPECT_EQ(reset->generation(), m.generation() + 1);

  EXPECT_TRUE(client_->DeleteModel("e2e-bn").ok());
  EXPECT_EQ(client_->GetModel("e2e-bn").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->DeleteModel("e2e-bn").code(), absl::StatusCode::kNotFound);
}

TEST_F(EndToEndTest, CreateModelImportsStateAndRejectsDuplicates) {
  v1::CreateModelRequest create;
  create.set_name("e2e-import");
  create.set_num_features(2);
  create.set_momentum(0.2);
  create.set_eps(1e-3);
  for (double v : {1.0, -1.0}) create.add_running_mean(v);
  for (double v : {4.0, 9.0}) create.add_running_var(v);
  for (double v : {2.0, 0.5}) create.add_weight(v);
  for (double v : {0.25, -0.25}) create.add_bias(v);
  create.set_num_batches_tracked(7);
  auto state = client_->CreateModel(create);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->generation(), 1u);
  EXPECT_EQ(state->num_batches_tracked(), 7);
  EXPECT_EQ(state->momentum(), 0.2);
  EXPECT_EQ(client_->CreateModel(create).status().code(),
            absl::StatusCode::kAlreadyExists);
  auto eval =
      client_->Normalize(BatchNormRequest("e2e-import", false, {1, 2}, {3, 2}));
  ASSERT_TRUE(eval.ok()) << eval.status();
  auto y = TensorValues(eval->output());
  EXPECT_NEAR((*y)[0], (3 - 1) / std::sqrt(4 + 1e-3) * 2 + 0.25, 1e-12);
  EXPECT_NEAR((*y)[1], (2 + 1) / std::sqrt(9 + 1e-3) * 0.5 - 0.25, 1e-12);
  // A per-call weight/bias overrides the model's.
  auto request = BatchNormRequest("e2e-import", false, {1, 2}, {3, 2});
  *request.mutable_weight() = MakeTensor({2}, {1, 1}, v1::FLOAT32);
  *request.mutable_bias() = MakeTensor({2}, {0, 0}, v1::FLOAT64);
  request.set_eps(1e-5);
  auto plain = client_->Normalize(request);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_NEAR((*TensorValues(plain->output()))[0], 2 / std::sqrt(4 + 1e-5),
              1e-12);
}

TEST_F(EndToEndTest, FitCreatesModelAndPooledEvalWorks) {
  v1::CreateModelRequest create;
  create.set_name("e2e-pooled");
  create.set_num_features(3);
  create.set_use_pooled_statistics(true);
  ASSERT_TRUE(client_->CreateModel(create).ok());
  const std::string before = StateFingerprint();
  EXPECT_EQ(
      client_
          ->Normalize(BatchNormRequest("e2e-pooled", false, {1, 3}, {1, 2, 3}))
          .status()
          .code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(StateFingerprint(), before);

  const std::vector<double> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  auto fit = client_->Fit(FitRequest("e2e-pooled", {4, 3}, x));
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_EQ(fit->model().num_batches_tracked(), 1);
  EXPECT_NEAR(fit->model().mean(0), 5.5, 1e-15);
  EXPECT_NEAR(fit->model().var(0), 11.25, 1e-13);
  auto eval = client_->Normalize(
      BatchNormRequest("e2e-pooled", false, {1, 3}, {1, 2, 3}));
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_NEAR((*TensorValues(eval->output()))[0],
              (1 - 5.5) / std::sqrt(11.25 + 1e-5), 1e-12);

  // Fit on an unknown model creates it with C channels.
  auto created = client_->Fit(FitRequest("e2e-fit-new", {2, 2}, {1, 2, 3, 4}));
  ASSERT_TRUE(created.ok());
  EXPECT_EQ(created->model().num_features(), 2);
  EXPECT_EQ(created->model().generation(), 2u);
}

// Malformed requests: tests/e2e/bad_inputs.json, run by bad_input_test.{cc,py}.

TEST_F(EndToEndTest, NormalizeStreamAnswersInOrderAndReportsErrorsInline) {
  std::vector<v1::NormalizeRequest> requests;
  for (int i = 0; i < 5; ++i) {
    auto r = LayerNormRequest({1, 3}, {1.0 * i, 2.0 * i + 1, 4.0 * i + 3});
    r.set_request_id("s" + std::to_string(i));
    if (i == 2) r.set_normalized_ndim(5);  // Bad.
    requests.push_back(r);
  }
  auto responses = client_->NormalizeStream(requests);
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), 5u);
  for (int i = 0; i < 5; ++i) {
    const auto& r = (*responses)[i];
    EXPECT_EQ(r.request_id(), "s" + std::to_string(i));
    if (i == 2) {
      EXPECT_EQ(r.error().code(), 3);  // INVALID_ARGUMENT
      EXPECT_NE(r.error().message().find("normalized_ndim"), std::string::npos);
      EXPECT_FALSE(r.has_output());
    } else {
      EXPECT_FALSE(r.has_error());
      const auto single = client_->Normalize(requests[i]);
      EXPECT_EQ(r.output().SerializeAsString(),
                single->output().SerializeAsString());
    }
  }
}

TEST_F(EndToEndTest, FitStreamAppliesStepsInOrderAndStopsAtFirstError) {
  std::vector<v1::FitRequest> steps;
  for (int i = 0; i < 4; ++i) {
    steps.push_back(
        FitRequest("e2e-fitstream", {2, 2}, {1.0 + i, 2, 3, 4.0 * i}));
  }
  auto response = client_->FitStream(steps);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->model().num_batches_tracked(), 4);
  EXPECT_EQ(response->model().sample_count(), 8);
  // Same as four unary Fits on another model.
  for (auto step : steps) {
    step.set_model("e2e-fitunary");
    ASSERT_TRUE(client_->Fit(step).ok());
  }
  auto unary = client_->GetModel("e2e-fitunary");
  EXPECT_EQ(std::vector<double>(unary->running_var().begin(),
                                unary->running_var().end()),
            std::vector<double>(response->model().running_var().begin(),
                                response->model().running_var().end()));

  // A failing third message: the call fails, the first two stay applied.
  steps[2] = FitRequest("e2e-fitstream", {2, 3}, {1, 2, 3, 4, 5, 6});
  auto failed = client_->FitStream(steps);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(failed.status().message().find("message 2"), std::string::npos);
  EXPECT_EQ(client_->GetModel("e2e-fitstream")->num_batches_tracked(), 6);

  EXPECT_EQ(client_->FitStream({}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(EndToEndTest, RoutingHeaderIsNeverTrustedOverTheBody) {
  auto channel = grpc::CreateChannel(server_->target(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Normalizer::NewStub(channel);
  grpc::ClientContext context;
  context.AddMetadata("x-normd-model", "e2e-header-other");
  v1::FitResponse response;
  ASSERT_TRUE(stub->Fit(&context, FitRequest("e2e-header-body", {2, 1}, {1, 2}),
                        &response)
                  .ok());
  EXPECT_EQ(response.model().name(), "e2e-header-body");
  EXPECT_EQ(client_->GetModel("e2e-header-other").status().code(),
            absl::StatusCode::kNotFound);
}

// L2_NORM and WEIGHT_NORM over a stream: answers equal the unary calls'
// and hand-worked values, a bad g is answered inline, and the elements are
// counted under their own mode labels.
TEST_F(EndToEndTest, L2AndWeightNormStreamAndCountTheirElements) {
  const std::string before =
      testing::HttpGet(server_->metrics_port(), "/metrics");
  auto l2 = LayerNormRequest({2, 2}, {3, 4, 0, 0}, v1::FLOAT64);
  l2.set_mode(v1::L2_NORM);
  auto weight_norm = LayerNormRequest({2, 2}, {3, 4, 0, 5}, v1::FLOAT64);
  weight_norm.set_mode(v1::WEIGHT_NORM);
  weight_norm.clear_normalized_ndim();
  weight_norm.mutable_weight()->set_dtype(v1::FLOAT64);
  weight_norm.mutable_weight()->add_shape(2);
  weight_norm.mutable_weight()->add_values(2);
  weight_norm.mutable_weight()->add_values(10);
  auto bad_g = weight_norm;
  bad_g.mutable_weight()->add_values(1);
  bad_g.mutable_weight()->set_shape(0, 3);
  auto responses = client_->NormalizeStream({l2, bad_g, weight_norm});
  ASSERT_TRUE(responses.ok()) << responses.status();
  ASSERT_EQ(responses->size(), 3u);
  auto values = [](const v1::NormalizeResponse& r) {
    return TensorValues(r.output()).value_or(std::vector<double>{});
  };
  // Rows {3, 4} / 5 and a zero row kept zero.
  const std::vector<double> unit = values((*responses)[0]);
  ASSERT_EQ(unit.size(), 4u);
  EXPECT_NEAR(unit[0], 0.6, 1e-15);
  EXPECT_NEAR(unit[1], 0.8, 1e-15);
  EXPECT_EQ(unit[2], 0.0);
  EXPECT_EQ(values(*client_->Normalize(l2)), unit);
  EXPECT_EQ((*responses)[1].error().code(), 3);
  EXPECT_EQ((*responses)[1].error().message().rfind("weight.shape", 0), 0u)
      << (*responses)[1].error().message();
  // Row norms 5 and 5: g = 2 and 10.
  const std::vector<double> w = values((*responses)[2]);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 1.2, 1e-15);
  EXPECT_NEAR(w[1], 1.6, 1e-15);
  EXPECT_EQ(w[2], 0.0);
  EXPECT_NEAR(w[3], 10.0, 1e-14);
  const std::string after =
      testing::HttpGet(server_->metrics_port(), "/metrics");
  for (const char* mode : {"mode=\"l2_norm\"", "mode=\"weight_norm\""}) {
    const double was = MetricValue(before, "normd_elements_total", {mode});
    EXPECT_EQ(MetricValue(after, "normd_elements_total", {mode}),
              std::max(was, 0.0) +
                  (std::string(mode).find("l2") != std::string::npos ? 8 : 4))
        << mode;
  }
}

TEST_F(EndToEndTest, MetricsCountCallsCodesElementsAndModels) {
  const std::string before =
      testing::HttpGet(server_->metrics_port(), "/metrics");
  const double ok_before =
      MetricValue(before, "grpc_server_handled_total",
                  {"grpc_method=\"Normalize\"", "grpc_code=\"OK\""});
  const double bad_before = MetricValue(
      before, "grpc_server_handled_total",
      {"grpc_method=\"Normalize\"", "grpc_code=\"InvalidArgument\""});
  const double ln_before =
      MetricValue(before, "normd_elements_total", {"mode=\"layer_norm\""});
  ASSERT_GE(ok_before, 0) << before;

  ASSERT_TRUE(
      client_->Normalize(LayerNormRequest({2, 5}, std::vector<double>(10, 1)))
          .ok());
  auto bad = LayerNormRequest({2}, {1, 2});
  bad.set_normalized_ndim(4);
  ASSERT_FALSE(client_->Normalize(bad).ok());
  ASSERT_TRUE(client_->Fit(FitRequest("e2e-metrics", {2, 1}, {1, 2})).ok());

  const std::string after =
      testing::HttpGet(server_->metrics_port(), "/metrics");
  EXPECT_EQ(MetricValue(after, "grpc_server_handled_total",
                        {"grpc_method=\"Normalize\"", "grpc_code=\"OK\""}),
            ok_before + 1);
  EXPECT_EQ(MetricValue(
                after, "grpc_server_handled_total",
                {"grpc_method=\"Normalize\"", "grpc_code=\"InvalidArgument\""}),
            bad_before + 1);
  EXPECT_EQ(MetricValue(after, "normd_elements_total", {"mode=\"layer_norm\""}),
            ln_before + 10);
  EXPECT_GE(
      MetricValue(after, "grpc_server_started_total", {"grpc_method=\"Fit\""}),
      1);
  EXPECT_GE(MetricValue(after, "grpc_server_handling_seconds_count",
                        {"grpc_method=\"Normalize\""}),
            2);
  EXPECT_EQ(MetricValue(after, "normd_models", {}),
            static_cast<double>(client_->ListModels()->models_size()));
  EXPECT_EQ(MetricValue(after, "normd_inflight_requests", {}), 0);
  // No label carries a model name.
  EXPECT_EQ(after.find("e2e-metrics"), std::string::npos);
  // In memory (no --state_dir) the state metrics are absent, as
  // docs/flags-and-metrics.md says.
  for (const char* state_metric :
       {"normd_state_writable", "normd_snapshots_total", "normd_wal_"}) {
    EXPECT_EQ(after.find(state_metric), std::string::npos) << state_metric;
  }
}

TEST_F(EndToEndTest, EveryModeCountsItsElementsUnderItsOwnLabel) {
  struct Case {
    v1::Mode mode;
    const char* label;
  };
  for (const Case& c : {Case{v1::GROUP_NORM, "group_norm"},
                        Case{v1::INSTANCE_NORM, "instance_norm"},
                        Case{v1::RMS_NORM, "rms_norm"}}) {
    SCOPED_TRACE(c.label);
    const std::string label = absl::StrCat("mode=\"", c.label, "\"");
    const double before =
        MetricValue(testing::HttpGet(server_->metrics_port(), "/metrics"),
                    "normd_elements_total", {label});
    auto request = LayerNormRequest({2, 4, 3}, std::vector<double>(24, 1.5));
    request.set_mode(c.mode);
    if (c.mode == v1::GROUP_NORM) request.set_num_groups(2);
    auto response = client_->Normalize(request);
    ASSERT_TRUE(response.ok()) << response.status();
    // Constant input: GroupNorm / InstanceNorm give the (zero) bias, RMSNorm
    // x / sqrt(x^2 + eps).
    auto y = TensorValues(response->output());
    ASSERT_TRUE(y.ok());
    ASSERT_EQ(y->size(), 24u);
    const double want =
        c.mode == v1::RMS_NORM ? 1.5 / std::sqrt(1.5 * 1.5 + 1e-5) : 0.0;
    for (double v : *y) {
      EXPECT_NEAR(v, want, testing::Fp32OutputBound(want, 0.0, 1.0));
    }
    EXPECT_EQ(MetricValue(testing::HttpGet(server_->metrics_port(), "/metrics"),
                          "normd_elements_total", {label}),
              before + 24);
  }
}

TEST(ServerLimitsTest, MaxModelsAndMaxFeaturesAreResourceExhausted) {
  ServerProcess server;
  ASSERT_TRUE(
      server.Start(NORMD_BINARY, {"--max_models=2", "--max_num_features=4"}))
      << server.log();
  auto client = NormdClient::Connect(server.target());
  ASSERT_TRUE(client->Fit(FitRequest("a", {2, 1}, {1, 2})).ok());
  ASSERT_TRUE(client->Fit(FitRequest("b", {2, 1}, {1, 2})).ok());
  auto third = client->Fit(FitRequest("c", {2, 1}, {1, 2}));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("max_models"), std::string::npos);
  ASSERT_TRUE(client->DeleteModel("b").ok());
  v1::CreateModelRequest wide;
  wide.set_name("wide");
  wide.set_num_features(5);
  EXPECT_EQ(client->CreateModel(wide).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Huge: refused before anything is allocated.
  wide.set_num_features(int64_t{1} << 40);
  EXPECT_EQ(client->CreateModel(wide).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Malformed beats over-limit.
  ASSERT_TRUE(client->Fit(FitRequest("b", {2, 1}, {1, 2})).ok());
  wide.set_name("bad name");
  EXPECT_EQ(client->CreateModel(wide).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Fit(FitRequest("bad name", {2, 1}, {1, 2})).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->ListModels()->models_size(), 2);
  client.reset();  // An idle sync client would not ack the GOAWAY ping.
  EXPECT_EQ(server.Stop(SIGINT), 0) << server.log();
}

TEST(ServerLifecycleTest, BusyPortOrBadFlagFailsToStart) {
  ServerProcess first;
  ASSERT_TRUE(first.Start(NORMD_BINARY)) << first.log();
  // gRPC would share a port through SO_REUSEPORT; normd refuses.
  ServerProcess second;
  EXPECT_FALSE(
      second.Start(NORMD_BINARY, {"--port=" + std::to_string(first.port())}));
  EXPECT_NE(second.log().find("cannot listen for gRPC"), std::string::npos)
      << second.log();
  ServerProcess bad;
  EXPECT_FALSE(bad.Start(NORMD_BINARY, {"--max_message_bytes=0"}));
  EXPECT_NE(bad.log().find("--max_message_bytes"), std::string::npos)
      << bad.log();
  ServerProcess bad_arenas;
  EXPECT_FALSE(bad_arenas.Start(NORMD_BINARY, {"--malloc_arenas=-1"}));
  EXPECT_NE(bad_arenas.log().find("--malloc_arenas must be >= 0, is -1"),
            std::string::npos)
      << bad_arenas.log();
  ServerProcess bad_keep;
  EXPECT_FALSE(bad_keep.Start(NORMD_BINARY, {"--malloc_keep_freed_bytes=-1"}));
  EXPECT_NE(bad_keep.log().find("--malloc_keep_freed_bytes must be in [0, "),
            std::string::npos)
      << bad_keep.log();
  ServerProcess bad_linger;
  EXPECT_FALSE(bad_linger.Start(NORMD_BINARY, {"--http_linger_timeout=-1s"}));
  EXPECT_NE(bad_linger.log().find("--http_linger_timeout: must be >= 0s"),
            std::string::npos)
      << bad_linger.log();
  EXPECT_EQ(first.Stop(), 0);
}

TEST(ServerLifecycleTest, SigtermDrainsInFlightStreamsAndExitsZero) {
  const std::string state_dir = testing::FreshTempDir("normd_sigterm", "state");
  ServerProcess server;
  ASSERT_TRUE(server.Start(
      NORMD_BINARY, {"--shutdown_grace=20s", "--state_dir=" + state_dir}))
      << server.log();
  auto channel =
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials());
  auto stub = v1::Normalizer::NewStub(channel);
  grpc::ClientContext context;
  v1::FitResponse response;
  auto stream = stub->FitStream(&context, &response);
  ASSERT_TRUE(stream->Write(FitRequest("drain", {2, 1}, {1, 2})));
  // A load balancer's health watch sees SERVING, then NOT_SERVING on SIGTERM.
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext watch_context;
  grpc::health::v1::HealthCheckRequest watch_request;
  watch_request.set_service("normd.v1.Normalizer");
  auto watch = health->Watch(&watch_context, watch_request);
  grpc::health::v1::HealthCheckResponse update;
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::SERVING);
  // Make sure the first step is applied before the signal.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto signalled = std::chrono::steady_clock::now();
  server.Signal(SIGTERM);
  ASSERT_TRUE(watch->Read(&update));
  EXPECT_EQ(update.status(), HealthCheckResponse::NOT_SERVING);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // No new calls, on a new connection or this one.
  {
    auto fresh = v1::Normalizer::NewStub(grpc::CreateChannel(
        server.target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext get_context;
    get_context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::seconds(2));
    v1::GetModelRequest get;
    get.set_name("drain");
    v1::ModelState state;
    EXPECT_FALSE(fresh->GetModel(&get_context, get, &state).ok());
    grpc::ClientContext same_context;
    EXPECT_FALSE(stub->GetModel(&same_context, get, &state).ok());
  }
  // The call in flight still completes.
  ASSERT_TRUE(stream->Write(FitRequest("drain", {2, 1}, {3, 5})));
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model().num_batches_tracked(), 2);
  // The watch ended by itself after NOT_SERVING.
  EXPECT_FALSE(watch->Read(&update));
  EXPECT_TRUE(watch->Finish().ok());
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  // The open health watch did not hold the drain to its 20 s limit.
  EXPECT_LT(std::chrono::steady_clock::now() - signalled,
            std::chrono::seconds(15));
  const std::string log = server.log();
  EXPECT_NE(log.find("received"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped"), std::string::npos) << log;
  // Start (state + serving) and stop only: no per-request lines.
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 4) << log;

  // The final snapshot holds both steps: nothing is left to replay.
  ServerProcess restarted;
  ASSERT_TRUE(restarted.Start(NORMD_BINARY, {"--state_dir=" + state_dir}))
      << restarted.log();
  EXPECT_NE(restarted.log().find("+ 0 log records"), std::string::npos)
      << restarted.log();
  auto client = NormdClient::Connect(restarted.target());
  auto model = client->GetModel("drain");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->num_batches_tracked(), 2);
  EXPECT_EQ(model->generation(), 3u);
}

TEST(ServerLifecycleTest, CallsOutlivingTheGraceAreCancelledAndExitIsZero) {
  ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY, {"--shutdown_grace=1s"}))
      << server.log();
  auto stub = v1::Normalizer::NewStub(
      grpc::CreateChannel(server.target(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::FitResponse response;
  auto stream = stub->FitStream(&context, &response);
  ASSERT_TRUE(stream->Write(FitRequest("slow", {2, 1}, {1, 2})));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto signalled = std::chrono::steady_clock::now();
  // The client never half-closes: the grace runs out.
  EXPECT_EQ(server.Stop(SIGTERM), 0) << server.log();
  const auto took = std::chrono::steady_clock::now() - signalled;
  EXPECT_GE(took, std::chrono::milliseconds(900));
  EXPECT_LT(took, std::chrono::seconds(8));
  EXPECT_FALSE(stream->Finish().ok());
}

}  // namespace
}  // namespace normd

// One call's lifecycle (server/service/call.h), the same for every front
// end, without a network: the token decided before anything is admitted,
// admission and its growth against both limits, calls whose client has gone
// never run, allocation failures as RESOURCE_EXHAUSTED, the durability wait
// (a fake log that makes changes durable only when told), the reply budget,
// and the metrics each call leaves.
#include "server/service/call.h"

#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <functional>
#include <map>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/core/mutation_log.h"
#include "tests/testing/service_stack.h"

namespace normd {
namespace {

using testing::ServiceStack;
using testing::ServiceStackOptions;

constexpr TokenCarrier kCarrier{"Authorization", "header"};

// The value of the series `name` whose labels include all of `labels`
// (nullopt when there is none).
std::optional<double> Metric(prometheus::Registry& registry,
                             const std::string& name,
                             const std::map<std::string, std::string>& labels) {
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      size_t matched = 0;
      for (const prometheus::ClientMetric::Label& label : metric.label) {
        auto it = labels.find(label.name);
        if (it != labels.end() && it->second == label.value) ++matched;
      }
      if (matched != labels.size()) continue;
      if (family.type == prometheus::MetricType::Counter) {
        return metric.counter.value;
      }
      if (family.type == prometheus::MetricType::Gauge) {
        return metric.gauge.value;
      }
      return static_cast<double>(metric.histogram.sample_count);
    }
  }
  return std::nullopt;
}

TEST(CallTest, TheTokenIsDecidedBeforeAnythingIsAdmitted) {
  ServiceStack stack(ServiceStackOptions{.auth_token = "s3cret"});
  Call call(stack.service, Protocol::kRest, Method::kModelInfer);
  absl::Status missing = call.Authenticate(std::nullopt, kCarrier);
  EXPECT_EQ(missing.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(missing.message(),
            "Authorization: this server needs the header \"Authorization: "
            "Bearer <token>\" with its token (--auth_token_file); it was "
            "missing");
  absl::Status wrong = call.Authenticate("Bearer s3cre", kCarrier);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(wrong.message().find("it was wrong"), absl::string_view::npos);
  EXPECT_EQ(call.Authenticate("bearer s3cret", kCarrier).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(call.Authenticate("Bearer s3cret", kCarrier).ok());
  // Nothing was admitted by the refusals.
  EXPECT_EQ(stack.admission.requests(), 0);
  EXPECT_EQ(stack.admission.bytes(), 0);
  // Without a configured token every call passes.
  ServiceStack open;
  Call anyone(open.service, Protocol::kGrpc, Method::kNormalize);
  EXPECT_TRUE(anyone.Authenticate(std::nullopt, kCarrier).ok());
}

TEST(CallTest, AdmissionRefusesPastEitherLimitAndCountsTheRefusal) {
  ServiceStack stack(ServiceStackOptions{.max_inflight_requests = 2,
                                         .max_inflight_bytes = 100});
  Call first(stack.service, Protocol::kGrpc, Method::kNormalize);
  ASSERT_TRUE(first.Admit(60).ok());
  Call second(stack.service, Protocol::kRest, Method::kModelInfer);
  ASSERT_TRUE(second.Admit(10).ok());
  Call third(stack.service, Protocol::kOipGrpc, Method::kModelInfer);
  const absl::Status refused = third.Admit(10);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("--max_inflight_requests"),
            absl::string_view::npos);
  EXPECT_EQ(Metric(stack.registry, "normd_rejected_total", {}), 1.0);
  // The first call's reply grows its ticket within the byte limit.
  EXPECT_TRUE(first.AdmitMore(20).ok());
  const absl::Status too_much = first.AdmitMore(20);
  EXPECT_EQ(too_much.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_much.message().find("--max_inflight_bytes"),
            absl::string_view::npos);
  EXPECT_EQ(stack.admission.bytes(), 90);
  EXPECT_EQ(Metric(stack.registry, "normd_rejected_total", {}), 2.0);
  // Finishing gives everything back: the next call is admitted.
  first.Finish(absl::StatusCode::kOk);
  EXPECT_EQ(stack.admission.requests(), 1);
  EXPECT_EQ(stack.admission.bytes(), 10);
  EXPECT_TRUE(third.Admit(10).ok());
  second.Finish(absl::StatusCode::kOk);
  third.Finish(absl::StatusCode::kOk);
  EXPECT_EQ(stack.admission.requests(), 0);
  EXPECT_EQ(stack.admission.bytes(), 0);
}

TEST(CallTest, ACallAloneMayHoldMoreThanTheByteLimit) {
  ServiceStack stack(ServiceStackOptions{.max_inflight_bytes = 100});
  Call big(stack.service, Protocol::kRest, Method::kModelInfer);
  EXPECT_TRUE(big.Admit(500).ok());
  EXPECT_TRUE(big.AdmitMore(500).ok());
  Call other(stack.service, Protocol::kRest, Method::kModelInfer);
  EXPECT_EQ(other.Admit(1).code(), absl::StatusCode::kResourceExhausted);
}

TEST(CallTest, CallsWhoseClientHasGoneAreNotRun) {
  ServiceStack stack;
  int runs = 0;
  const auto body = [&] {
    ++runs;
    return absl::OkStatus();
  };
  std::vector<absl::Status> results;
  const auto done = [&](absl::Status s) { results.push_back(std::move(s)); };
  {
    Call call(stack.service, Protocol::kGrpc, Method::kNormalize);
    call.set_cancelled_probe([] { return true; });
    call.Run(body, done);
  }
  {
    Call call(stack.service, Protocol::kRest, Method::kModelInfer);
    call.set_deadline(absl::Now() - absl::Seconds(1));
    call.Run(body, done);
  }
  {
    Call call(stack.service, Protocol::kRest, Method::kModelInfer);
    call.set_deadline(absl::Now() + absl::Hours(1));
    call.set_cancelled_probe([] { return false; });
    call.Run(body, done);
  }
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(results[1].code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(results[2].ok());
  EXPECT_EQ(runs, 1);
}

TEST(CallTest, AllocationFailuresAreResourceExhausted) {
  ServiceStack stack;
  Call call(stack.service, Protocol::kRest, Method::kModelInfer);
  absl::Status result;
  call.Run([]() -> absl::Status { throw std::bad_alloc(); },
           [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(result.message().find("--max_inflight_bytes"),
            absl::string_view::npos);
  std::vector<int> v;
  call.Run(
      [&]() -> absl::Status {
        v.reserve(v.max_size() + 1);  // std::length_error.
        return absl::OkStatus();
      },
      [&](absl::Status s) { result = s; });
  EXPECT_EQ(result.code(), absl::StatusCode::kResourceExhausted);
}

TEST(CallTest, EachCallIsRecordedOnceByProtocolMethodAndCode) {
  ServiceStack stack;
  {
    Call call(stack.service, Protocol::kRest, Method::kModelInfer);
    EXPECT_EQ(Metric(stack.registry, "normd_inflight_requests", {}), 1.0);
    call.Finish(absl::StatusCode::kInvalidArgument);
    call.Finish(absl::StatusCode::kOk);  // Ignored.
    EXPECT_TRUE(call.finished());
  }
  { Call abandoned(stack.service, Protocol::kOipGrpc, Method::kModelInfer); }
  EXPECT_EQ(Metric(stack.registry, "normd_inflight_requests", {}), 0.0);
  EXPECT_EQ(Metric(stack.registry, "normd_requests_total",
                   {{"protocol", "rest"},
                    {"method", "ModelInfer"},
                    {"code", "InvalidArgument"}}),
            1.0);
  EXPECT_EQ(
      Metric(stack.registry, "normd_requests_total",
             {{"protocol", "rest"}, {"method", "ModelInfer"}, {"code", "OK"}}),
      0.0);
  EXPECT_EQ(Metric(stack.registry, "normd_requests_total",
                   {{"protocol", "oip_grpc"},
                    {"method", "ModelInfer"},
                    {"code", "Canceled"}}),
            1.0);
  EXPECT_EQ(Metric(stack.registry, "normd_request_duration_seconds",
                   {{"protocol", "rest"}, {"method", "ModelInfer"}}),
            1.0);
  // Only the methods a protocol serves have series.
  EXPECT_FALSE(Metric(stack.registry, "normd_requests_total",
                      {{"protocol", "grpc"}, {"method", "ModelInfer"}})
                   .has_value());
  EXPECT_FALSE(Metric(stack.registry, "normd_requests_total",
                      {{"protocol", "oip_grpc"}, {"method", "RepositoryIndex"}})
                   .has_value());
}

// A log whose records become durable only when the test says so.
class ManualLog final : public MutationLog {
 public:
  absl::Status Healthy() override { return absl::OkStatus(); }
  uint64_t Append(const Mutation&) override { return ++appended_; }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  void OnDurable(uint64_t sequence,
                 std::function<void(absl::Status)> done) override {
    waiting_.push_back({sequence, std::move(done)});
  }
  // Makes every record durable (or failed) and calls who waited.
  void Sync(const absl::Status& status) {
    std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> now;
    now.swap(waiting_);
    for (auto& [sequence, done] : now) done(status);
  }
  size_t waiting() const { return waiting_.size(); }

 private:
  uint64_t appended_ = 0;
  std::vector<std::pair<uint64_t, std::function<void(absl::Status)>>> waiting_;
};

TEST(CallTest, AChangeIsAnsweredOnlyOnceItIsDurable) {
  ServiceStack stack;
  ManualLog log;
  stack.service.store().SetMutationLog(&log);
  ModelSpec spec;
  spec.name = "durable";
  spec.num_features = 2;
  std::optional<absl::Status> answered;
  Call call(stack.service, Protocol::kGrpc, Method::kCreateModel);
  call.Run([&] { return stack.service.CreateModel(spec).status(); },
           [&](absl::Status s) { answered = s; });
  EXPECT_FALSE(answered.has_value());  // Applied, not yet durable.
  EXPECT_EQ(log.waiting(), 1u);
  log.Sync(absl::OkStatus());
  ASSERT_TRUE(answered.has_value());
  EXPECT_TRUE(answered->ok());
  // A read changes nothing and is answered at once.
  answered.reset();
  call.Run([&] { return stack.service.GetModel("durable").status(); },
           [&](absl::Status s) { answered = s; });
  ASSERT_TRUE(answered.has_value());
  EXPECT_TRUE(answered->ok());
  // A log that fails to sync turns the change's answer into its error.
  answered.reset();
  call.Run([&] { return stack.service.ResetModel("durable").status(); },
           [&](absl::Status s) { answered = s; });
  log.Sync(absl::DataLossError("disk gone"));
  ASSERT_TRUE(answered.has_value());
  EXPECT_EQ(answered->code(), absl::StatusCode::kDataLoss);
  stack.service.store().SetMutationLog(nullptr);
}

TEST(CallTest, AReplyPastTheBudgetIsRefusedBeforeAnythingChanges) {
  // A model of 4096 channels answers with ~196 KiB of arrays: past a 64 KiB
  // budget with them, within it without (an OIP reply carries counters
  // only).
  ServiceStack stack(ServiceStackOptions{.max_message_bytes = 64 << 10});
  ModelSpec spec;
  spec.name = "wide";
  spec.num_features = 4096;
  const absl::StatusOr<BatchNormModel> refused =
      stack.service.CreateModel(spec);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max_message_bytes"),
            absl::string_view::npos);
  EXPECT_EQ(stack.service.store().size(), 0);
  std::vector<float> x(4096 * 2, 1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 7);
  FitSpec fit{.model = "wide",
              .input = InputTensor{.dtype = DType::kFloat32,
                                   .shape = {2, 4096},
                                   .data = x.data(),
                                   .size = 8192},
              .channel_axis = std::nullopt};
  EXPECT_EQ(stack.service.Fit(fit, ReplySize{.bytes = 0}).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(stack.service.store().size(), 0);
  const absl::StatusOr<BatchNormModel> counters_only = stack.service.Fit(
      fit, ReplySize{.bytes = 100, .with_model_arrays = false});
  ASSERT_TRUE(counters_only.ok()) << counters_only.status();
  EXPECT_EQ(counters_only->num_batches_tracked, 1);
}

}  // namespace
}  // namespace normd

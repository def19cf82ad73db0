// The bad-input table (tests/e2e/bad_inputs.json) from C++: every malformed
// request gets its exact gRPC code and a message naming the field, changes no
// model, and the server still serves afterwards. The same table runs from
// Python in tests/bad_input_test.py.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "normd/v1/normalizer.grpc.pb.h"
#include "tests/testing/server_process.h"

namespace normd {
namespace {

using ::google::protobuf::Message;
using ::google::protobuf::Struct;
using ::google::protobuf::Value;

constexpr size_t kOversizeBytes = 1200000;

Struct LoadTable() {
  std::ifstream in(NORMD_BAD_INPUTS);
  std::stringstream text;
  text << in.rdbuf();
  Struct table;
  const auto status =
      google::protobuf::util::JsonStringToMessage(text.str(), &table);
  EXPECT_TRUE(status.ok()) << status.ToString();
  return table;
}

const Value& Field(const Struct& s, const std::string& name) {
  static const Value kNull;
  auto it = s.fields().find(name);
  return it == s.fields().end() ? kNull : it->second;
}

// Parses a row's request (protobuf JSON) into `message`; input.data
// "OVERSIZE" becomes kOversizeBytes of zeros.
void ParseRequest(const Value& fields, Message& message) {
  Struct request = fields.struct_value();
  bool oversize = false;
  auto input = request.mutable_fields()->find("input");
  if (input != request.mutable_fields()->end()) {
    auto& input_fields =
        *input->second.mutable_struct_value()->mutable_fields();
    auto data = input_fields.find("data");
    if (data != input_fields.end() &&
        data->second.string_value() == "OVERSIZE") {
      oversize = true;
      input_fields.erase(data);
    }
  }
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(request, &json).ok());
  const auto status =
      google::protobuf::util::JsonStringToMessage(json, &message);
  ASSERT_TRUE(status.ok()) << status.ToString() << " in " << json;
  if (oversize) {
    static_cast<v1::NormalizeRequest&>(message).mutable_input()->set_data(
        std::string(kOversizeBytes, '\0'));
  }
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    table_ = LoadTable();
    std::vector<std::string> flags;
    for (const Value& flag :
         Field(table_, "server_flags").list_value().values()) {
      flags.push_back(flag.string_value());
    }
    ASSERT_TRUE(server_.Start(NORMD_BINARY, flags)) << server_.log();
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(-1);
    channel_ = grpc::CreateCustomChannel(
        server_.target(), grpc::InsecureChannelCredentials(), args);
    stub_ = v1::Normalizer::NewStub(channel_);
  }

  // Calls `rpc` with the request `fields`; the status.
  grpc::Status Call(const std::string& rpc, const Value& fields) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    auto run = [&](auto request, auto response, auto method) {
      ParseRequest(fields, request);
      return ((*stub_).*method)(&context, request, &response);
    };
    using S = v1::Normalizer::Stub;
    if (rpc == "Normalize") {
      return run(v1::NormalizeRequest(), v1::NormalizeResponse(),
                 &S::Normalize);
    }
    if (rpc == "Fit") return run(v1::FitRequest(), v1::FitResponse(), &S::Fit);
    if (rpc == "CreateModel") {
      return run(v1::CreateModelRequest(), v1::ModelState(), &S::CreateModel);
    }
    if (rpc == "GetModel") {
      return run(v1::GetModelRequest(), v1::ModelState(), &S::GetModel);
    }
    if (rpc == "DeleteModel") {
      return run(v1::DeleteModelRequest(), v1::DeleteModelResponse(),
                 &S::DeleteModel);
    }
    if (rpc == "ResetModel") {
      return run(v1::ResetModelRequest(), v1::ModelState(), &S::ResetModel);
    }
    if (rpc == "ExportModel") {
      return run(v1::ExportModelRequest(), v1::ModelState(), &S::ExportModel);
    }
    if (rpc == "ImportModel") {
      return run(v1::ImportModelRequest(), v1::ModelState(), &S::ImportModel);
    }
    if (rpc == "MergeModel") {
      return run(v1::MergeModelRequest(), v1::ModelState(), &S::MergeModel);
    }
    if (rpc == "CreateModels") {
      return run(v1::CreateModelsRequest(), v1::CreateModelsResponse(),
                 &S::CreateModels);
    }
    ADD_FAILURE() << "unknown rpc " << rpc;
    return grpc::Status::CANCELLED;
  }

  // Every model, serialized with its arrays, by name.
  std::map<std::string, std::string> Fingerprint() {
    std::map<std::string, std::string> out;
    grpc::ClientContext context;
    v1::ListModelsResponse list;
    EXPECT_TRUE(stub_->ListModels(&context, {}, &list).ok());
    for (const auto& m : list.models()) {
      grpc::ClientContext get_context;
      v1::GetModelRequest get;
      get.set_name(m.name());
      v1::ModelState state;
      EXPECT_TRUE(stub_->GetModel(&get_context, get, &state).ok());
      out[m.name()] = state.SerializeAsString();
    }
    return out;
  }

  static grpc::StatusCode CodeNamed(const std::string& name) {
    static const std::map<std::string, grpc::StatusCode> kCodes = {
        {"INVALID_ARGUMENT", grpc::StatusCode::INVALID_ARGUMENT},
        {"NOT_FOUND", grpc::StatusCode::NOT_FOUND},
        {"ALREADY_EXISTS", grpc::StatusCode::ALREADY_EXISTS},
        {"FAILED_PRECONDITION", grpc::StatusCode::FAILED_PRECONDITION},
        {"RESOURCE_EXHAUSTED", grpc::StatusCode::RESOURCE_EXHAUSTED},
        {"UNIMPLEMENTED", grpc::StatusCode::UNIMPLEMENTED}};
    auto it = kCodes.find(name);
    EXPECT_NE(it, kCodes.end()) << name;
    return it == kCodes.end() ? grpc::StatusCode::UNKNOWN : it->second;
  }

  Struct table_;
  testing::ServerProcess server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Normalizer::Stub> stub_;
};

TEST_F(BadInputTest, EveryRowGetsItsCodeAndFieldAndChangesNothing) {
  for (const Value& step : Field(table_, "setup").list_value().values()) {
    const grpc::Status s =
        Call(Field(step.struct_value(), "rpc").string_value(),
             Field(step.struct_value(), "request"));
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const auto& rows = Field(table_, "rows").list_value().values();
  ASSERT_GE(rows.size(), 40);
  for (const Value& row_value : rows) {
    const Struct& row = row_value.struct_value();
    SCOPED_TRACE(Field(row, "name").string_value());
    const auto before = Fingerprint();
    const grpc::Status status =
        Call(Field(row, "rpc").string_value(), Field(row, "request"));
    EXPECT_EQ(status.error_code(), CodeNamed(Field(row, "code").string_value()))
        << status.error_message();
    EXPECT_NE(status.error_message().find(Field(row, "field").string_value()),
              std::string::npos)
        << status.error_message();
    EXPECT_EQ(Fingerprint(), before) << "the state changed";
  }

  // A bad message in the middle of a NormalizeStream is answered inline and
  // the stream goes on.
  const Struct& streams = Field(table_, "streams").struct_value();
  {
    const Struct& spec = Field(streams, "normalize").struct_value();
    const auto before = Fingerprint();
    grpc::ClientContext context;
    auto stream = stub_->NormalizeStream(&context);
    const auto& requests = Field(spec, "requests").list_value().values();
    const auto& errors = Field(spec, "errors").list_value().values();
    for (int i = 0; i < requests.size(); ++i) {
      v1::NormalizeRequest request;
      ParseRequest(requests[i], request);
      ASSERT_TRUE(stream->Write(request));
      v1::NormalizeResponse response;
      ASSERT_TRUE(stream->Read(&response));
      SCOPED_TRACE(i);
      if (errors[i].has_null_value()) {
        EXPECT_FALSE(response.has_error()) << response.error().message();
        EXPECT_EQ(response.output().values_size(), 6);
      } else {
        const Struct& want = errors[i].struct_value();
        EXPECT_EQ(response.error().code(),
                  CodeNamed(Field(want, "code").string_value()));
        EXPECT_NE(response.error().message().find(
                      Field(want, "field").string_value()),
                  std::string::npos);
      }
    }
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(Fingerprint(), before);
  }
  // A bad message in the middle of a FitStream ends the call; the steps
  // before it stay applied, the ones after it never run.
  {
    const Struct& spec = Field(streams, "fit").struct_value();
    auto before = Fingerprint();
    grpc::ClientContext context;
    v1::FitResponse response;
    auto stream = stub_->FitStream(&context, &response);
    for (const Value& fields : Field(spec, "requests").list_value().values()) {
      v1::FitRequest request;
      ParseRequest(fields, request);
      if (!stream->Write(request)) break;  // The server may end it early.
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(),
              CodeNamed(Field(spec, "code").string_value()));
    EXPECT_NE(status.error_message().find(Field(spec, "field").string_value()),
              std::string::npos)
        << status.error_message();
    auto after = Fingerprint();
    const std::string model = Field(spec, "model").string_value();
    v1::ModelState state;
    ASSERT_TRUE(state.ParseFromString(after[model]));
    EXPECT_EQ(state.num_batches_tracked(),
              Field(spec, "applied_steps").number_value());
    after.erase(model);
    EXPECT_EQ(after, before);
  }

  // Still serving.
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  request.set_service("normd.v1.Normalizer");
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(server_.Stop(), 0) << server_.log();
}

}  // namespace
}  // namespace normd

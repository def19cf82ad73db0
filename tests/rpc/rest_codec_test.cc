// The REST front-end's translation without a socket: JSON and binary-data
// bodies into OIP messages (values checked against hand-worked bytes), the
// response JSON read back by the C library's strtof/strtod, the routes, and
// the HTTP status of each error code.
#include "server/http/rest_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/http/rest_handler.h"
#include "server/rpc/status_mapping.h"

namespace normd {
namespace {

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

absl::Status Parse(
    const std::string& body, RestInferRequest& request,
    std::optional<absl::string_view> header_length = std::nullopt) {
  return ParseRestInferRequest(body, header_length, "layer_norm", "", request);
}

TEST(RestCodecTest, FlatAndNestedDataGiveTheSameRowMajorBytes) {
  for (const char* data :
       {"[1, 2.5, -3, 4, 5e-1, 6]", "[[1, 2.5, -3], [4, 5e-1, 6]]"}) {
    RestInferRequest request;
    ASSERT_TRUE(Parse(absl::StrCat(R"({"id": "a", "inputs": [{"name": )"
                                   R"("input", "datatype": "FP32", )"
                                   R"("shape": [2, 3], "data": )",
                                   data, "}]}"),
                      request)
                    .ok())
        << data;
    const inference::ModelInferRequest& m = request.message;
    EXPECT_EQ(m.model_name(), "layer_norm");
    EXPECT_EQ(m.id(), "a");
    ASSERT_EQ(m.raw_input_contents_size(), 1);
    EXPECT_EQ(Values<float>(m.raw_input_contents(0)),
              (std::vector<float>{1, 2.5f, -3, 4, 0.5f, 6}));
    EXPECT_EQ(m.inputs(0).shape_size(), 2);
    EXPECT_FALSE(request.binary_output);
  }
}

TEST(RestCodecTest, NumbersRoundFromTheirNearestDoubleToTheDatatype) {
  RestInferRequest request;
  ASSERT_TRUE(Parse(R"({"inputs": [)"
                    R"({"name": "input", "datatype": "FP16", "shape": [3],)"
                    R"( "data": [0.1, 65504, -2]},)"
                    R"({"name": "weight", "datatype": "BF16", "shape": [2],)"
                    R"( "data": [0.1, 3]},)"
                    R"({"name": "bias", "datatype": "FP64", "shape": [1],)"
                    R"( "data": [0.1]}]})",
                    request)
                  .ok());
  // Hand-worked: 0.1 is 0x2E66 in binary16 (1.6 x 2^-4, mantissa 0x266
  // rounded up) and 0x3DCD in bfloat16; 65504 is binary16's largest, 0x7BFF.
  EXPECT_EQ(Values<uint16_t>(request.message.raw_input_contents(0)),
            (std::vector<uint16_t>{0x2E66, 0x7BFF, 0xC000}));
  EXPECT_EQ(Values<uint16_t>(request.message.raw_input_contents(1)),
            (std::vector<uint16_t>{0x3DCD, 0x4040}));
  EXPECT_EQ(Values<double>(request.message.raw_input_contents(2)),
            (std::vector<double>{0.1}));
}

TEST(RestCodecTest, BadBodiesNameTheirField) {
  const struct {
    const char* body;
    const char* field;
  } cases[] = {
      {R"({"inputs": [)", "body: malformed JSON"},
      {R"([1])", "must be an object"},
      {R"({"inputs": [], "inputs": []})", "inputs: given twice"},
      {R"({"input": []})", "unknown key \"input\""},
      {R"({"id": 5, "inputs": []})", "id: must be a string"},
      {R"({"outputs": []})", "inputs: required"},
      {R"({"inputs": [{"name": "input", "datatype": "FP16", "shape": [2],)"
       R"( "data": [1, 70000]}]})",
       "inputs[0].data[1]: 70000 is not finite as FP16"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1],)"
       R"( "data": [1e39]}]})",
       "inputs[0].data[0]: 1e+39 is not finite as FP32"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2, 2],)"
       R"( "data": [[1, 2], [3]]}]})",
       "inputs[0].data[1]: 1 entries; dimension 1"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2],)"
       R"( "data": [[1], [2]]}]})",
       "inputs[0].data[0]: nested deeper than the shape"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [3],)"
       R"( "data": [1, 2]}]})",
       "inputs[0].data: 2 values; shape [3] has 3"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1],)"
       R"( "data": [true]}]})",
       "inputs[0].data[0]: must be a number, got a bool"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1]}]})",
       "inputs[0].data: required"},
      {R"({"parameters": {"eps": null}, "inputs": []})",
       "parameters.eps: must be a bool, a number or a string, got null"},
      {R"({"parameters": {"binary_data_output": 1}, "inputs": []})",
       "parameters.binary_data_output: must be a bool"},
  };
  for (const auto& c : cases) {
    RestInferRequest request;
    const absl::Status status = Parse(c.body, request);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(status.message().find(c.field), absl::string_view::npos)
        << c.body << " -> " << status.message();
  }
}

TEST(RestCodecTest, BinaryDataIsTakenInInputOrder) {
  const std::string head =
      R"({"inputs": [{"name": "input", "datatype": "FP32", "shape": [2],)"
      R"( "parameters": {"binary_data_size": 8}},)"
      R"({"name": "bias", "datatype": "FP64", "shape": [1],)"
      R"( "parameters": {"binary_data_size": 8}}],)"
      R"( "outputs": [{"name": "output", "parameters": {"binary_data": true}}]})";
  const float input[2] = {1.5f, -2};
  const double bias = 0.25;
  std::string body = head;
  body.append(reinterpret_cast<const char*>(input), sizeof(input));
  body.append(reinterpret_cast<const char*>(&bias), sizeof(bias));
  const std::string length = std::to_string(head.size());
  RestInferRequest request;
  ASSERT_TRUE(Parse(body, request, length).ok());
  EXPECT_EQ(Values<float>(request.message.raw_input_contents(0)),
            (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(Values<double>(request.message.raw_input_contents(1)),
            (std::vector<double>{0.25}));
  EXPECT_TRUE(request.binary_output);
  EXPECT_TRUE(request.message.outputs(0).parameters().empty());

  RestInferRequest overrun;
  EXPECT_NE(Parse(body.substr(0, body.size() - 1), overrun, length)
                .message()
                .find("inputs[1].parameters.binary_data_size: 8 bytes, but "
                      "only 7"),
            absl::string_view::npos);
  RestInferRequest extra;
  EXPECT_NE(Parse(body + "x", extra, length).message().find("1 bytes"),
            absl::string_view::npos);
  RestInferRequest bad_length;
  EXPECT_NE(Parse(body, bad_length, "9999999")
                .message()
                .find("Inference-Header-Content-Length"),
            absl::string_view::npos);
}

// The JSON of a response's output data, as a list of number strings.
std::vector<std::string> OutputNumbers(const std::string& json) {
  const size_t data = json.find("\"data\":[");
  const size_t end = json.find(']', data);
  return absl::StrSplit(json.substr(data + 8, end - data - 8), ',');
}

TEST(RestCodecTest, Fp32OutputReadsBackBitForBit) {
  std::mt19937 rng(11);
  std::vector<float> values;
  while (values.size() < 100000) {
    const uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    if (std::isfinite(f)) values.push_back(f);
  }
  inference::ModelInferResponse response;
  auto& output = *response.add_outputs();
  output.set_name("output");
  output.set_datatype("FP32");
  output.add_shape(static_cast<int64_t>(values.size()));
  response.add_raw_output_contents(std::string(
      reinterpret_cast<const char*>(values.data()), values.size() * 4));
  RestBody body;
  FormatRestInferResponse(response, false, body);
  EXPECT_FALSE(body.json_bytes.has_value());
  const std::vector<std::string> numbers = OutputNumbers(body.bytes);
  ASSERT_EQ(numbers.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float back = std::strtof(numbers[i].c_str(), nullptr);
    ASSERT_EQ(std::memcmp(&back, &values[i], sizeof(back)), 0)
        << numbers[i] << " for " << values[i];
  }
}

TEST(RestCodecTest, NonFiniteOutputsAreWrittenAsPythonReadsThem) {
  const double values[3] = {NAN, INFINITY, -INFINITY};
  inference::ModelInferResponse response;
  response.set_model_name("m");
  auto& output = *response.add_outputs();
  output.set_datatype("FP64");
  response.add_raw_output_contents(
      std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  (*response.mutable_parameters())["generation"].set_int64_param(7);
  RestBody body;
  FormatRestInferResponse(response, false, body);
  EXPECT_NE(body.bytes.find(R"("data":[NaN,Infinity,-Infinity])"),
            std::string::npos)
      << body.bytes;
  EXPECT_NE(body.bytes.find(R"("parameters":{"generation":7})"),
            std::string::npos);
}

TEST(RestCodecTest, BinaryOutputFollowsItsJsonHead) {
  const float values[2] = {1, 2};
  inference::ModelInferResponse response;
  auto& output = *response.add_outputs();
  output.set_name("output");
  output.set_datatype("FP32");
  output.add_shape(2);
  response.add_raw_output_contents(
      std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  RestBody body;
  FormatRestInferResponse(response, true, body);
  ASSERT_TRUE(body.json_bytes.has_value());
  const std::string head = body.bytes.substr(0, *body.json_bytes);
  EXPECT_NE(head.find(R"("parameters":{"binary_data_size":8})"),
            std::string::npos);
  EXPECT_EQ(body.bytes.substr(*body.json_bytes),
            std::string(reinterpret_cast<const char*>(values), 8));
}

TEST(RestCodecTest, JsonStringsAreEscaped) {
  std::string out;
  AppendJsonString("a\"b\\c\n\x01", out);
  EXPECT_EQ(out, R"("a\"b\\c\n\u0001")");
}

TEST(RestRouteTest, PathsAndMethods) {
  RestRoute r = RouteRestRequest("POST", "/v2/models/a%2Fb/versions/1/infer");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelInfer);
  EXPECT_EQ(r.model, "a/b");
  EXPECT_EQ(r.version, "1");
  EXPECT_TRUE(r.method_allowed);
  r = RouteRestRequest("GET", "/v2/models/m/infer");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelInfer);
  EXPECT_FALSE(r.method_allowed);
  EXPECT_STREQ(r.allowed, "POST");
  EXPECT_EQ(RouteRestRequest("GET", "/v2/models/m?x=1").endpoint,
            RestEndpoint::kModelMetadata);
  EXPECT_EQ(RouteRestRequest("HEAD", "/v2/health/ready").endpoint,
            RestEndpoint::kHealthReady);
  EXPECT_TRUE(RouteRestRequest("HEAD", "/v2/health/ready").method_allowed);
  EXPECT_EQ(RouteRestRequest("GET", "/v2").endpoint,
            RestEndpoint::kServerMetadata);
  for (const char* path :
       {"/v2/", "/v3", "/v2/models", "/v2/models//ready",
        "/v2/models/m/versions//ready", "v2", "/v2/models/m/ready/x"}) {
    EXPECT_EQ(RouteRestRequest("GET", path).endpoint, RestEndpoint::kUnknown)
        << path;
  }
}

TEST(HttpStatusTest, EachCodeHasApiMdsStatus) {
  using C = absl::StatusCode;
  const struct {
    C code;
    int status;
  } table[] = {{C::kOk, 200},
               {C::kInvalidArgument, 400},
               {C::kFailedPrecondition, 400},
               {C::kOutOfRange, 400},
               {C::kNotFound, 404},
               {C::kUnauthenticated, 401},
               {C::kResourceExhausted, 429},
               {C::kUnavailable, 503},
               {C::kInternal, 500},
               {C::kAlreadyExists, 500},
               {C::kDataLoss, 500}};
  for (const auto& row : table) {
    EXPECT_EQ(HttpStatusOf(row.code), row.status)
        << absl::StatusCodeToString(row.code);
  }
}

}  // namespace
}  // namespace normd

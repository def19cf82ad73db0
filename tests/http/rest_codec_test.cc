// The REST front end's translation without a socket: JSON and binary-data
// bodies into the service's infer requests (values checked against
// hand-worked bytes), linear parsing of hostile bodies, the reply JSON read
// back by the C library's strtof/strtod, the routes, and the HTTP status of
// each error code.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/http/infer_body.h"
#include "server/http/rest_json.h"
#include "server/http/rest_router.h"
#include "server/service/status_mapping.h"

namespace normd {
namespace {

template <typename T>
std::vector<T> Values(const TensorBytes& bytes) {
  const absl::string_view view = *bytes.contiguous;
  std::vector<T> values(view.size() / sizeof(T));
  std::memcpy(values.data(), view.data(), values.size() * sizeof(T));
  return values;
}

absl::Status Parse(
    const std::string& body, RestInferRequest& request,
    std::optional<absl::string_view> header_length = std::nullopt) {
  return ParseInferBody(body, body.size(), header_length, "layer_norm", "",
                        request);
}

TEST(RestCodecTest, FlatAndNestedDataGiveTheSameRowMajorBytes) {
  for (const char* data :
       {"[1, 2.5, -3, 4, 5e-1, 6]", "[[1, 2.5, -3], [4, 5e-1, 6]]"}) {
    RestInferRequest parsed;
    ASSERT_TRUE(Parse(absl::StrCat(R"({"id": "a", "inputs": [{"name": )"
                                   R"("input", "datatype": "FP32", )"
                                   R"("shape": [2, 3], "data": )",
                                   data, "}]}"),
                      parsed)
                    .ok())
        << data;
    const InferRequest& r = parsed.request;
    EXPECT_EQ(r.model_name, "layer_norm");
    EXPECT_EQ(r.id, "a");
    ASSERT_EQ(r.inputs.size(), 1u);
    EXPECT_EQ(Values<float>(r.inputs[0].data),
              (std::vector<float>{1, 2.5f, -3, 4, 0.5f, 6}));
    EXPECT_EQ(r.inputs[0].shape, (Shape{2, 3}));
    EXPECT_EQ(r.inputs[0].data_field, "inputs[0].data");
    EXPECT_FALSE(parsed.binary_output);
  }
}

TEST(RestCodecTest, NumbersRoundFromTheirNearestDoubleToTheDatatype) {
  RestInferRequest parsed;
  ASSERT_TRUE(Parse(R"({"inputs": [)"
                    R"({"name": "input", "datatype": "FP16", "shape": [3],)"
                    R"( "data": [0.1, 65504, -2]},)"
                    R"({"name": "weight", "datatype": "BF16", "shape": [2],)"
                    R"( "data": [0.1, 3]},)"
                    R"({"name": "bias", "datatype": "FP64", "shape": [1],)"
                    R"( "data": [0.1]}]})",
                    parsed)
                  .ok());
  // Hand-worked: 0.1 is 0x2E66 in binary16 (1.6 x 2^-4, mantissa 0x266
  // rounded up) and 0x3DCD in bfloat16; 65504 is binary16's largest, 0x7BFF.
  const InferRequest& r = parsed.request;
  EXPECT_EQ(Values<uint16_t>(r.inputs[0].data),
            (std::vector<uint16_t>{0x2E66, 0x7BFF, 0xC000}));
  EXPECT_EQ(Values<uint16_t>(r.inputs[1].data),
            (std::vector<uint16_t>{0x3DCD, 0x4040}));
  EXPECT_EQ(Values<double>(r.inputs[2].data), (std::vector<double>{0.1}));
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
      {R"({"parameters": {"a": 1, "a": 2}, "inputs": []})",
       "parameters.a: given twice"},
      // Past the first eight keys, repeats are found in a hash set: a
      // repeat of an early key and of a late one.
      {R"({"parameters": {"k0": 0, "k1": 1, "k2": 2, "k3": 3, "k4": 4,)"
       R"( "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": 9, "k1": 1},)"
       R"( "inputs": []})",
       "parameters.k1: given twice"},
      {R"({"parameters": {"k0": 0, "k1": 1, "k2": 2, "k3": 3, "k4": 4,)"
       R"( "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": 9, "k9": 9},)"
       R"( "inputs": []})",
       "parameters.k9: given twice"},
      {R"({"parameters": {"k0": 0, "k1": 1, "k2": 2, "k3": 3, "k4": 4,)"
       R"( "k5": 5, "k6": 6, "k7": 7, "k7": 7}, "inputs": []})",
       "parameters.k7: given twice"},
      {R"({"parameters": {"seq": 18446744073709551615}, "inputs": []})",
       "parameters.seq: 18446744073709551615 is out of range"},
      // An absurd shape names the shape, and is never allocated for.
      {R"({"inputs": [{"name": "input", "datatype": "FP32",)"
       R"( "shape": [1, 1152921504606846976], "data": [1, 2]}]})",
       "inputs[0].shape: the product of the dims overflows"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32",)"
       R"( "shape": [1, 576460752303423488], "data": [[1, 2]]}]})",
       "inputs[0].data[0]: 2 entries; dimension 1 of shape"},
      {R"({"inputs": [{"name": "input", "datatype": "FP32",)"
       R"( "shape": [2, -3], "data": [1]}]})",
       "inputs[0].shape[1]: dim -3 is negative"},
  };
  for (const auto& c : cases) {
    RestInferRequest parsed;
    const absl::Status status = Parse(c.body, parsed);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_NE(status.message().find(c.field), absl::string_view::npos)
        << c.body << " -> " << status.message();
  }
}

// A body so nested that it passes simdjson's depth limit is malformed JSON,
// never a stack overflow.
TEST(RestCodecTest, DeepNestingIsMalformedJson) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  RestInferRequest parsed;
  const absl::Status status =
      Parse(absl::StrCat(R"({"inputs": [{"name": "input", "datatype": "FP32",)"
                         R"( "shape": [1], "data": )",
                         deep, "}]}"),
            parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("body: malformed JSON"),
            absl::string_view::npos)
      << status;
}

// Arrays past simdjson's 2^24 - 1 count are counted exactly: 17,000,000
// values of shape [17000000] are taken, one fewer is named.
TEST(RestCodecTest, ArraysPastSixteenMillionValuesAreCountedExactly) {
  constexpr int64_t kValues = 17000000;
  std::string data = "[";
  data.reserve(2 * kValues + 2);
  for (int64_t i = 0; i < kValues; ++i) data.append(i ? ",1" : "1");
  data.push_back(']');
  for (const int64_t shape : {kValues, kValues - 1}) {
    RestInferRequest parsed;
    const absl::Status status = Parse(
        absl::StrCat(R"({"inputs": [{"name": "input", "datatype": "FP32",)",
                     R"( "shape": [)", shape, R"(], "data": )", data, "}]}"),
        parsed);
    if (shape == kValues) {
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_EQ(parsed.request.inputs[0].data.size(), 4 * kValues);
    } else {
      EXPECT_NE(status.message().find(
                    absl::StrCat("17000000 values; shape [16999999]")),
                absl::string_view::npos)
          << status;
    }
  }
}

// 120,000 parameter names (a 1.5 MB body) parse in time linear in the body:
// the duplicate check is a hash set, not a comparison with every earlier
// name. Generous: the quadratic check took minutes.
TEST(RestCodecTest, ManyParameterNamesParseInLinearTime) {
  std::string body = R"({"parameters": {)";
  for (int i = 0; i < 120000; ++i) {
    absl::StrAppend(&body, i ? "," : "", "\"p", i, "\":", i);
  }
  body += R"(}, "inputs": []})";
  RestInferRequest parsed;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Parse(body, parsed).ok());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  EXPECT_EQ(parsed.request.parameters.size(), 120000u);
  EXPECT_LT(seconds, 5.0);
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
  RestInferRequest parsed;
  ASSERT_TRUE(Parse(body, parsed, length).ok());
  const InferRequest& r = parsed.request;
  EXPECT_EQ(Values<float>(r.inputs[0].data), (std::vector<float>{1.5f, -2}));
  EXPECT_EQ(Values<double>(r.inputs[1].data), (std::vector<double>{0.25}));
  // In place in the body: no copy.
  EXPECT_EQ(r.inputs[0].data.contiguous->data(), body.data() + head.size());
  EXPECT_EQ(r.inputs[0].data_field, "inputs[0].parameters.binary_data_size");
  EXPECT_TRUE(parsed.binary_output);
  EXPECT_TRUE(r.outputs[0].parameters.empty());

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

// The JSON of a reply's output data, as a list of number strings.
std::vector<std::string> OutputNumbers(const std::string& json) {
  const size_t data = json.find("\"data\":[");
  const size_t end = json.find(']', data);
  return absl::StrSplit(json.substr(data + 8, end - data - 8), ',');
}

InferReply Reply(DType dtype, int64_t elements) {
  InferReply reply;
  reply.output.datatype = OipDatatypeName(dtype);
  reply.output.dtype = dtype;
  reply.output.shape = {elements};
  reply.output.elements = elements;
  reply.output.bytes = elements * ElementSize(dtype);
  return reply;
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
  const std::string json = FormatInferReply(
      "layer_norm", "", Reply(DType::kFloat32, values.size()),
      absl::string_view(reinterpret_cast<const char*>(values.data()),
                        values.size() * 4),
      false);
  EXPECT_LE(static_cast<int64_t>(json.size()),
            JsonOutputBytes(DType::kFloat32, values.size()) + 256);
  const std::vector<std::string> numbers = OutputNumbers(json);
  ASSERT_EQ(numbers.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    const float back = std::strtof(numbers[i].c_str(), nullptr);
    ASSERT_EQ(std::memcmp(&back, &values[i], sizeof(back)), 0)
        << numbers[i] << " for " << values[i];
  }
}

// Unsigned counters stay unsigned: a generation past 2^63 is written as the
// decimal it is, never negative.
TEST(RestCodecTest, NonFiniteOutputsAndLargeCountersAreWrittenAsTheyAre) {
  const double values[3] = {NAN, INFINITY, -INFINITY};
  InferReply reply = Reply(DType::kFloat64, 3);
  reply.counters = ModelCounters{.num_batches_tracked = 7,
                                 .generation = 18446744073709551615ull};
  const std::string json = FormatInferReply(
      "m", "", reply,
      absl::string_view(reinterpret_cast<const char*>(values), sizeof(values)),
      false);
  EXPECT_NE(json.find(R"("data":[NaN,Infinity,-Infinity])"), std::string::npos)
      << json;
  EXPECT_NE(json.find(R"("parameters":{"generation":18446744073709551615,)"
                      R"("num_batches_tracked":7})"),
            std::string::npos)
      << json;
}

TEST(RestCodecTest, BinaryOutputIsAnnouncedInItsJsonHead) {
  const float values[2] = {1, 2};
  const std::string head = FormatInferReply(
      "layer_norm", "x", Reply(DType::kFloat32, 2),
      absl::string_view(reinterpret_cast<const char*>(values), 8), true);
  EXPECT_NE(head.find(R"("parameters":{"binary_data_size":8})"),
            std::string::npos);
  EXPECT_EQ(head.find("\"data\""), std::string::npos);
}

TEST(RestCodecTest, JsonStringsAreEscaped) {
  std::string out;
  AppendJsonString("a\"b\\c\n\x01", out);
  EXPECT_EQ(out, R"("a\"b\\c\n\u0001")");
  // Valid UTF-8 is kept; a string that is not (a client's bytes echoed
  // back) has its non-ASCII bytes written as U+FFFD: the JSON stays valid.
  out.clear();
  AppendJsonString("caf\xC3\xA9", out);
  EXPECT_EQ(out, "\"caf\xC3\xA9\"");
  out.clear();
  AppendJsonString("b\x89\xFFn", out);
  EXPECT_EQ(out, R"("b\ufffd\ufffdn")");
}

TEST(RestRouteTest, PathsAndMethods) {
  RestRoute r = *RouteRestRequest("POST", "/v2/models/a%2Fb/versions/1/infer");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelInfer);
  EXPECT_EQ(r.model, "a/b");
  EXPECT_EQ(r.version, "1");
  EXPECT_TRUE(r.method_allowed);
  r = *RouteRestRequest("GET", "/v2/models/m/infer");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelInfer);
  EXPECT_FALSE(r.method_allowed);
  EXPECT_STREQ(r.allowed, "POST");
  EXPECT_EQ(RouteRestRequest("GET", "/v2/models/m?x=1")->endpoint,
            RestEndpoint::kModelMetadata);
  EXPECT_EQ(RouteRestRequest("HEAD", "/v2/health/ready")->endpoint,
            RestEndpoint::kHealthReady);
  EXPECT_TRUE(RouteRestRequest("HEAD", "/v2/health/ready")->method_allowed);
  EXPECT_EQ(RouteRestRequest("GET", "/v2")->endpoint,
            RestEndpoint::kServerMetadata);
  // Triton's extensions.
  EXPECT_EQ(RouteRestRequest("POST", "/v2/repository/index")->endpoint,
            RestEndpoint::kRepositoryIndex);
  EXPECT_FALSE(RouteRestRequest("GET", "/v2/repository/index")->method_allowed);
  r = *RouteRestRequest("GET", "/v2/models/stats");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelStatistics);
  EXPECT_EQ(r.model, "");
  r = *RouteRestRequest("GET", "/v2/models/bn.1/versions/1/stats");
  EXPECT_EQ(r.endpoint, RestEndpoint::kModelStatistics);
  EXPECT_EQ(r.model, "bn.1");
  EXPECT_EQ(RouteRestRequest("GET", "/v2/models/bn.1/config")->endpoint,
            RestEndpoint::kModelConfig);
  for (const char* path : {"/v2/", "/v3", "/v2/models", "/v2/models//ready",
                           "/v2/models/m/versions//ready", "v2",
                           "/v2/models/m/ready/x", "/v2/repository"}) {
    EXPECT_EQ(RouteRestRequest("GET", path)->endpoint, RestEndpoint::kUnknown)
        << path;
  }
  // A "%" without two hex digits is malformed, named in the message.
  for (const char* path : {"/v2/models/a%2", "/v2/models/a%zz/ready",
                           "/v2/models/m/versions/%/infer"}) {
    const absl::StatusOr<RestRoute> bad = RouteRestRequest("GET", path);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument) << path;
    EXPECT_NE(bad.status().message().find("path:"), absl::string_view::npos);
  }
  EXPECT_EQ(*PercentDecoded("a%2fb%2F%41"), "a/b/A");
  EXPECT_FALSE(PercentDecoded("%4").has_value());
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

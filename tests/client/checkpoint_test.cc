// The checkpoint readers and writer of normctl import-checkpoint /
// export-checkpoint, in process: safetensors bytes worked by hand and every
// way a file can be damaged, ONNX models built message by message (raw and
// typed initializers, 16-bit types, shared initializers, external data),
// the models-to-state_dict conversion and the atomic write.
#include "client/checkpoint/checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpoint/layer_values.h"
#include "client/checkpoint/onnx_layers.h"
#include "client/checkpoint/safetensors.h"
#include "tests/testing/temp_dir.h"

namespace normd::client {
namespace {

std::string Le32(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  std::string out;
  for (int i = 0; i < 4; ++i)
    out += static_cast<char>((bits >> (8 * i)) & 0xff);
  return out;
}

std::string F32(std::vector<float> values) {
  std::string out;
  for (float v : values) out += Le32(v);
  return out;
}

std::string I64(int64_t value) {
  std::string out;
  for (int i = 0; i < 8; ++i) {
    out += static_cast<char>((static_cast<uint64_t>(value) >> (8 * i)) & 0xff);
  }
  return out;
}

// A file from a header written by hand and its data.
std::string FileOf(const std::string& header, const std::string& data) {
  return I64(static_cast<int64_t>(header.size())) + header + data;
}

// One BatchNorm layer "bn" of two channels, as PyTorch's state_dict has it.
std::vector<SafetensorsOutput> BnTensors() {
  return {{"bn.running_mean", "F32", {2}, F32({0.5f, -1.25f})},
          {"bn.running_var", "F32", {2}, F32({2.0f, 0.125f})},
          {"bn.weight", "F32", {2}, F32({1.5f, 3.0f})},
          {"bn.bias", "F32", {2}, F32({0.0f, -2.0f})},
          {"bn.num_batches_tracked", "I64", {}, I64(42)},
          {"conv.weight", "F32", {2, 1}, F32({7.0f, 8.0f})}};
}

absl::StatusOr<std::vector<CheckpointLayer>> Layers(const std::string& file) {
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ParseSafetensors(file, "f.safetensors", kDefaultMaxHeaderBytes);
  if (!tensors.ok()) return tensors.status();
  return LayersFromSafetensors(*tensors, "f.safetensors");
}

TEST(SafetensorsTest, BytesAreTheFormatsAndReadBack) {
  absl::StatusOr<std::string> file =
      EncodeSafetensors({{"a", "F32", {1}, F32({1.0f})}});
  ASSERT_TRUE(file.ok()) << file.status();
  // Worked by hand: the header, padded with spaces to 8 bytes, then 1.0f.
  const std::string header =
      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  const std::string padded =
      header + std::string((8 - header.size() % 8) % 8, ' ');
  EXPECT_EQ(*file, FileOf(padded, std::string("\x00\x00\x80\x3f", 4)));

  absl::StatusOr<std::string> bn = EncodeSafetensors(BnTensors());
  ASSERT_TRUE(bn.ok());
  absl::StatusOr<std::vector<SafetensorsTensor>> tensors =
      ParseSafetensors(*bn, "f", kDefaultMaxHeaderBytes);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 6u);
  EXPECT_EQ((*tensors)[4].name, "bn.num_batches_tracked");
  EXPECT_TRUE((*tensors)[4].shape.empty());
  EXPECT_EQ((*tensors)[5].shape, (std::vector<int64_t>{2, 1}));

  absl::StatusOr<std::vector<CheckpointLayer>> layers = Layers(*bn);
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 1u);  // conv.weight is no BatchNorm layer.
  const CheckpointLayer& layer = (*layers)[0];
  EXPECT_EQ(layer.layer, "bn");
  EXPECT_EQ(layer.running_mean.values, (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(layer.running_var.values, (std::vector<double>{2.0, 0.125}));
  EXPECT_EQ(layer.weight.values, (std::vector<double>{1.5, 3.0}));
  EXPECT_EQ(layer.bias.values, (std::vector<double>{0.0, -2.0}));
  EXPECT_EQ(layer.num_batches_tracked, 42);
  EXPECT_EQ(layer.running_var.source, "bn.running_var");
}

TEST(SafetensorsTest, SixteenBitAndDoubleStatisticsWidenExactly) {
  // fp16 1.0 = 0x3c00, -2 = 0xc000; bf16 1.0 = 0x3f80, 0.5 = 0x3f00.
  const std::vector<SafetensorsOutput> tensors = {
      {"h.running_mean", "F16", {2}, std::string("\x00\x3c\x00\xc0", 4)},
      {"h.running_var", "BF16", {2}, std::string("\x80\x3f\x00\x3f", 4)},
      {"running_mean",
       "F64",
       {1},
       std::string("\x9a\x99\x99\x99\x99\x99\xb9\x3f", 8)},
      {"running_var",
       "F64",
       {1},
       std::string("\x00\x00\x00\x00\x00\x00\xf0\x3f", 8)}};
  absl::StatusOr<std::vector<CheckpointLayer>> layers =
      Layers(*EncodeSafetensors(tensors));
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 2u);
  // A bare module's keys make the layer "" (the model is named P).
  EXPECT_EQ((*layers)[0].layer, "");
  EXPECT_EQ((*layers)[0].running_mean.values, std::vector<double>{0.1});
  EXPECT_EQ((*layers)[1].running_mean.values, (std::vector<double>{1.0, -2.0}));
  EXPECT_EQ((*layers)[1].running_var.values, (std::vector<double>{1.0, 0.5}));
  EXPECT_EQ(HalfBitsToDouble(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(HalfBitsToDouble(0x7bff), 65504.0);
  EXPECT_EQ(HalfBitsToDouble(0xfc00), -HUGE_VAL);
  EXPECT_TRUE(std::isnan(HalfBitsToDouble(0x7e00)));
  EXPECT_EQ(BFloat16BitsToDouble(0xc2f7), -123.5);
}

struct BadFile {
  std::string what;
  std::function<std::string()> file;
  std::string mentions;  // Besides the file name.
};

// A file as the case builds it: a header and data as given, or the
// encoding of `tensors`.
std::function<std::string()> WithHeader(std::string text, std::string bytes) {
  return [text, bytes] { return FileOf(text, bytes); };
}
std::function<std::string()> WithTensors(
    std::vector<SafetensorsOutput> tensors) {
  return [tensors] { return *EncodeSafetensors(tensors); };
}
SafetensorsOutput Tensor(std::string key, std::string dtype,
                         std::vector<int64_t> shape, std::string bytes) {
  return SafetensorsOutput{key, dtype, shape, bytes};
}

// Each case's file is INVALID_ARGUMENT naming the file and what is wrong.
void ExpectRefused(const std::vector<BadFile>& cases) {
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status status = Layers(c.file()).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().substr(0, 15), "f.safetensors: ") << status;
    EXPECT_NE(status.message().find(c.mentions), std::string::npos) << status;
  }
}

// Files that break the safetensors format: the length, the header's JSON,
// offsets, dtypes, shapes, names and metadata.
TEST(SafetensorsTest, MalformedFilesAreRefusedNamingWhatIsWrong) {
  const std::string good_header =
      "{\"bn.running_mean\":{\"dtype\":\"F32\",\"shape\":[1],"
      "\"data_offsets\":[0,4]},\"bn.running_var\":{\"dtype\":\"F32\","
      "\"shape\":[1],\"data_offsets\":[4,8]}}";
  const std::string data = F32({0.0f, 1.0f});
  ExpectRefused({
      {"shorter than the length", [] { return std::string("\x05\x00", 2); },
       "fewer than the 8"},
      {"header past the end",
       [&] { return FileOf(good_header, data).substr(0, 60); },
       "runs past the end"},
      {"header over the limit", [] { return I64(int64_t{200'000'000}) + "{}"; },
       "--max_header_bytes"},
      {"not JSON", WithHeader("{\"bn.running_mean\": [", ""), "not valid JSON"},
      {"not an object", WithHeader("[1, 2]", ""), "not a JSON object"},
      {"truncated data", [&] { return FileOf(good_header, data.substr(0, 6)); },
       "not inside the file"},
      {"offsets out of range",
       WithHeader("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
                  "\"data_offsets\":[4,8]}}",
                  F32({1})),
       "tensor 'a'"},
      {"offsets overlap",
       WithHeader(
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           F32({1, 2})),
       "overlaps"},
      {"a hole in the data",
       WithHeader(
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           F32({1, 2})),
       "belong to no tensor"},
      {"bytes after the data", WithHeader(good_header, data + "xy"),
       "belong to no tensor"},
      {"shape and byte count disagree",
       WithHeader(
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}",
           F32({1, 2})),
       "takes 12"},
      {"dtype and byte count disagree",
       WithHeader(
           "{\"a\":{\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}",
           F32({1, 2})),
       "F64"},
      {"unknown dtype",
       WithHeader(
           "{\"a\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}",
           F32({1})),
       "unknown dtype 'F33'"},
      {"negative dim",
       WithHeader(
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}",
           F32({1})),
       "dimension >= 0"},
      {"a name twice",
       WithHeader(
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           F32({1, 2})),
       "named twice"},
      {"metadata not strings", WithHeader("{\"__metadata__\":{\"k\":1}}", ""),
       "__metadata__"},
      {"metadata not an object", WithHeader("{\"__metadata__\":1}", ""),
       "__metadata__"},
      {"metadata twice",
       WithHeader("{\"__metadata__\":{},\"__metadata__\":{}}", ""),
       "__metadata__"},
  });
}

// Well-formed files whose tensors are no BatchNorm layer normd can take:
// a statistic without its twin, sizes that disagree, integer or non-finite
// statistics, bad counters, no layer at all.
TEST(SafetensorsTest, UnsuitableLayersAreRefusedNamingTheTensor) {
  ExpectRefused({
      {"running_mean without running_var",
       WithTensors({Tensor("l.bn.running_mean", "F32", {1}, F32({0}))}),
       "no 'l.bn.running_var'"},
      {"running_var without running_mean",
       WithTensors({Tensor("l.bn.running_var", "F32", {1}, F32({1}))}),
       "no 'l.bn.running_mean'"},
      {"a counter alone",
       WithTensors({Tensor("bn.num_batches_tracked", "I64", {}, I64(1))}),
       "neither running_mean nor running_var"},
      {"tensors disagree on C",
       WithTensors({Tensor("bn.running_mean", "F32", {2}, F32({0, 0})),
                    Tensor("bn.running_var", "F32", {2}, F32({1, 1})),
                    Tensor("bn.weight", "F32", {3}, F32({1, 1, 1}))}),
       "tensor 'bn.weight' has 3 values"},
      {"a statistic that is not [C]",
       WithTensors({Tensor("bn.running_mean", "F32", {1, 2}, F32({0, 0})),
                    Tensor("bn.running_var", "F32", {2}, F32({1, 1}))}),
       "'bn.running_mean' has shape [1, 2]"},
      {"an integer statistic",
       WithTensors({Tensor("bn.running_mean", "I64", {1}, I64(0)),
                    Tensor("bn.running_var", "F32", {1}, F32({1}))}),
       "'bn.running_mean' is I64"},
      {"NaN mean",
       WithTensors({Tensor("bn.running_mean", "F32", {2},
                           F32({0, std::numeric_limits<float>::quiet_NaN()})),
                    Tensor("bn.running_var", "F32", {2}, F32({1, 1}))}),
       "'bn.running_mean' has nan at [1]"},
      {"negative variance",
       WithTensors({Tensor("bn.running_mean", "F32", {1}, F32({0})),
                    Tensor("bn.running_var", "F32", {1}, F32({-0.5f}))}),
       "'bn.running_var' has -0.5 at [0]"},
      {"a negative counter",
       WithTensors({Tensor("bn.running_mean", "F32", {1}, F32({0})),
                    Tensor("bn.running_var", "F32", {1}, F32({1})),
                    Tensor("bn.num_batches_tracked", "I64", {}, I64(-3))}),
       "must be >= 0"},
      {"a counter that is not a scalar",
       WithTensors({Tensor("bn.running_mean", "F32", {1}, F32({0})),
                    Tensor("bn.running_var", "F32", {1}, F32({1})),
                    Tensor("bn.num_batches_tracked", "F32", {1}, F32({1}))}),
       "I64 scalar"},
      {"no BatchNorm layer",
       WithTensors({Tensor("conv.weight", "F32", {1}, F32({1}))}),
       "no BatchNorm layer found"},
  });
}

TEST(CheckpointTest, RequestsTakeTheLayersAndTheOverrides) {
  absl::StatusOr<std::vector<CheckpointLayer>> layers =
      Layers(*EncodeSafetensors(BnTensors()));
  ASSERT_TRUE(layers.ok());
  v1::CreateModelsRequest plain = CreateModelsFor(*layers, "net", {});
  ASSERT_EQ(plain.models_size(), 1);
  const v1::CreateModelRequest& model = plain.models(0);
  EXPECT_EQ(model.name(), "net.bn");
  EXPECT_EQ(model.num_features(), 2);
  EXPECT_FALSE(model.has_momentum());
  EXPECT_FALSE(model.has_eps());
  EXPECT_EQ(model.running_var(1), 0.125);
  EXPECT_EQ(model.bias(1), -2.0);
  EXPECT_EQ(model.num_batches_tracked(), 42);
  v1::CreateModelsRequest overridden = CreateModelsFor(
      *layers, "net",
      {.momentum = 0.01, .cumulative_average = true, .eps = 1e-3});
  EXPECT_EQ(overridden.models(0).momentum(), 0.01);
  EXPECT_TRUE(overridden.models(0).cumulative_average());
  EXPECT_EQ(overridden.models(0).eps(), 1e-3);
  EXPECT_EQ(ModelNameOf("net", ""), "net");
}

v1::ModelState Model(const std::string& name) {
  v1::ModelState model;
  model.set_name(name);
  model.set_num_features(2);
  for (auto* field : {model.mutable_running_mean(), model.mutable_running_var(),
                      model.mutable_weight(), model.mutable_bias()}) {
    field->Add(0.25);
    field->Add(3.0);
  }
  model.set_num_batches_tracked(7);
  return model;
}

TEST(CheckpointTest, ModelsBecomeAPyTorchStateDict) {
  absl::StatusOr<std::vector<SafetensorsOutput>> tensors =
      StateDictOf({Model("net.b.bn"), Model("net.a")}, "net");
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  std::vector<std::string> names;
  for (const SafetensorsOutput& t : *tensors) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{
                       "a.bias", "a.num_batches_tracked", "a.running_mean",
                       "a.running_var", "a.weight", "b.bn.bias",
                       "b.bn.num_batches_tracked", "b.bn.running_mean",
                       "b.bn.running_var", "b.bn.weight"}));
  EXPECT_EQ((*tensors)[1].dtype, "I64");
  EXPECT_TRUE((*tensors)[1].shape.empty());
  EXPECT_EQ((*tensors)[1].data, I64(7));
  EXPECT_EQ((*tensors)[2].dtype, "F32");
  EXPECT_EQ((*tensors)[2].data, F32({0.25f, 3.0f}));
  // What is written reads back as the same layers.
  absl::StatusOr<std::vector<CheckpointLayer>> layers =
      Layers(*EncodeSafetensors(*tensors));
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ((*layers)[1].layer, "b.bn");
  EXPECT_EQ((*layers)[1].weight.values, (std::vector<double>{0.25, 3.0}));

  v1::ModelState huge = Model("net.x");
  huge.set_running_var(1, 1e300);
  const absl::Status status = StateDictOf({huge}, "net").status();
  EXPECT_NE(status.message().find("running_var[1]"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("float32"), std::string::npos) << status;
  EXPECT_FALSE(StateDictOf({Model("other.x")}, "net").ok());
  EXPECT_FALSE(StateDictOf({Model("network.x")}, "net").ok());
}

TEST(CheckpointTest, FilesAreWrittenAtomicallyAndPicklesAreNamed) {
  const std::string dir = testing::FreshTempDir("normd_checkpoint_test", "io");
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/out.safetensors";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, *EncodeSafetensors(BnTensors())).ok());
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++files;
    EXPECT_EQ(entry.path().filename(), "out.safetensors");
  }
  EXPECT_EQ(files, 1);  // No temporary file is left behind.
  absl::StatusOr<std::vector<CheckpointLayer>> read =
      ReadCheckpoint(path, kDefaultMaxHeaderBytes);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0].num_batches_tracked, 42);
  EXPECT_EQ(WriteFileAtomically(dir + "/missing/x", "x").code(),
            absl::StatusCode::kUnavailable);

  for (const std::string& name : {"model.pt", "model.pth", "weights.bin"}) {
    const absl::Status status =
        ReadCheckpoint(dir + "/" + name, kDefaultMaxHeaderBytes).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find(".safetensors"), std::string::npos);
    EXPECT_NE(status.message().find("import_module"), std::string::npos)
        << status;
  }
  // A torch.save zip under a safetensors name.
  std::ofstream(dir + "/zip.safetensors") << "PK\x03\x04rest of a zip";
  const absl::Status zip =
      ReadCheckpoint(dir + "/zip.safetensors", kDefaultMaxHeaderBytes).status();
  EXPECT_NE(zip.message().find("PyTorch pickle"), std::string::npos) << zip;
  EXPECT_EQ(ReadCheckpoint(dir + "/absent.safetensors", kDefaultMaxHeaderBytes)
                .status()
                .code(),
            absl::StatusCode::kNotFound);
  EXPECT_NE(ReadCheckpoint(dir + "/x.h5", kDefaultMaxHeaderBytes)
                .status()
                .message()
                .find("unknown kind"),
            std::string::npos);
}

// An ONNX initializer of `values` as float32 raw bytes.
onnx::TensorProto RawFloats(const std::string& name,
                            std::vector<float> values) {
  onnx::TensorProto tensor;
  tensor.set_name(name);
  tensor.set_data_type(onnx::TensorProto::FLOAT);
  tensor.add_dims(static_cast<int64_t>(values.size()));
  tensor.set_raw_data(F32(values));
  return tensor;
}

// A model with one BatchNormalization node over inputs `inputs` (X first)
// and the given initializers.
onnx::ModelProto OneNode(std::vector<std::string> inputs,
                         std::vector<onnx::TensorProto> initializers,
                         const std::string& node_name = "bn_node") {
  onnx::ModelProto model;
  onnx::NodeProto& node = *model.mutable_graph()->add_node();
  node.set_op_type("BatchNormalization");
  node.set_name(node_name);
  for (const std::string& input : inputs) node.add_input(input);
  for (onnx::TensorProto& tensor : initializers) {
    *model.mutable_graph()->add_initializer() = std::move(tensor);
  }
  return model;
}

TEST(OnnxLayersTest, NodesGiveLayersWithPyTorchSettings) {
  onnx::ModelProto model =
      OneNode({"x", "blk.bn.weight", "blk.bn.bias", "blk.bn.running_mean",
               "blk.bn.running_var"},
              {RawFloats("blk.bn.weight", {1.5f, 2.0f}),
               RawFloats("blk.bn.bias", {0.0f, -1.0f}),
               RawFloats("blk.bn.running_mean", {0.25f, 4.0f})});
  // The variance in the typed field, as float64.
  onnx::TensorProto& var = *model.mutable_graph()->add_initializer();
  var.set_name("blk.bn.running_var");
  var.set_data_type(onnx::TensorProto::DOUBLE);
  var.add_dims(2);
  var.add_double_data(0.1);
  var.add_double_data(9.0);
  onnx::AttributeProto& momentum =
      *model.mutable_graph()->mutable_node(0)->add_attribute();
  momentum.set_name("momentum");
  momentum.set_type(onnx::AttributeProto::FLOAT);
  momentum.set_f(0.99f);  // PyTorch's momentum 0.01.
  onnx::AttributeProto& epsilon =
      *model.mutable_graph()->mutable_node(0)->add_attribute();
  epsilon.set_name("epsilon");
  epsilon.set_type(onnx::AttributeProto::FLOAT);
  epsilon.set_f(1e-3f);
  absl::StatusOr<std::vector<CheckpointLayer>> layers =
      LayersFromOnnx(model, "m.onnx");
  ASSERT_TRUE(layers.ok()) << layers.status();
  ASSERT_EQ(layers->size(), 1u);
  const CheckpointLayer& layer = (*layers)[0];
  EXPECT_EQ(layer.layer, "blk.bn");
  EXPECT_EQ(layer.weight.values, (std::vector<double>{1.5, 2.0}));
  EXPECT_EQ(layer.running_var.values, (std::vector<double>{0.1, 9.0}));
  // The shortest decimals, not 1 - 0.99f = 0.0099999904...
  EXPECT_EQ(*layer.momentum, 0.01);
  EXPECT_EQ(*layer.eps, 1e-3);

  // Defaults (ONNX momentum 0.9, epsilon 1e-5), typed float32 and float16
  // fields, statistics shared through Identity and given by a Constant, and
  // a layer named after its node when its mean has no state_dict name.
  onnx::TensorProto half;
  half.set_name("shared_var");
  half.set_data_type(onnx::TensorProto::FLOAT16);
  half.add_dims(1);
  half.add_int32_data(0x3e00);  // 1.5
  onnx::TensorProto typed;
  typed.set_name("scale");
  typed.set_data_type(onnx::TensorProto::FLOAT);
  typed.add_dims(1);
  typed.add_float_data(2.5f);
  onnx::ModelProto shared =
      OneNode({"x", "scale", "bias", "mean", "var_copy"},
              {half, typed, RawFloats("bias", {0.5f})}, "/head/bn");
  onnx::NodeProto& identity = *shared.mutable_graph()->add_node();
  identity.set_op_type("Identity");
  identity.add_input("var_mid");
  identity.add_output("var_copy");
  onnx::NodeProto& hop = *shared.mutable_graph()->add_node();
  hop.set_op_type("Identity");
  hop.add_input("shared_var");
  hop.add_output("var_mid");
  onnx::NodeProto& constant = *shared.mutable_graph()->add_node();
  constant.set_op_type("Constant");
  constant.add_output("mean");
  onnx::AttributeProto& value = *constant.add_attribute();
  value.set_name("value");
  value.set_type(onnx::AttributeProto::TENSOR);
  *value.mutable_t() = RawFloats("", {-3.0f});
  layers = LayersFromOnnx(shared, "m.onnx");
  ASSERT_TRUE(layers.ok()) << layers.status();
  EXPECT_EQ((*layers)[0].layer, "/head/bn");
  EXPECT_EQ((*layers)[0].running_mean.values, std::vector<double>{-3.0});
  EXPECT_EQ((*layers)[0].running_var.values, std::vector<double>{1.5});
  EXPECT_EQ((*layers)[0].running_var.source, "var_copy");
  EXPECT_EQ((*layers)[0].weight.values, std::vector<double>{2.5});
  EXPECT_EQ(*(*layers)[0].momentum, 0.1);
  EXPECT_EQ(*(*layers)[0].eps, 1e-5);
}

TEST(OnnxLayersTest, UnusableModelsAreRefusedNamingNodeAndTensor) {
  const std::vector<std::string> inputs = {"x", "w", "b", "m", "v"};
  const auto stats = [] {
    return std::vector<onnx::TensorProto>{
        RawFloats("w", {1}), RawFloats("b", {0}), RawFloats("m", {0}),
        RawFloats("v", {1})};
  };
  struct Case {
    std::string what;
    std::function<onnx::ModelProto()> model;
    std::string mentions;
  };
  const std::vector<Case> cases = {
      {"external data",
       [&] {
         onnx::ModelProto model = OneNode(inputs, stats());
         onnx::TensorProto& v = *model.mutable_graph()->mutable_initializer(3);
         v.clear_raw_data();
         v.set_data_location(onnx::TensorProto::EXTERNAL);
         onnx::StringStringEntryProto& entry = *v.add_external_data();
         entry.set_key("location");
         entry.set_value("weights.bin");
         return model;
       },
       "external file 'weights.bin'"},
      {"statistics computed, not stored",
       [&] {
         std::vector<onnx::TensorProto> some = stats();
         some.pop_back();
         return OneNode(inputs, some);
       },
       "input_var 'v' is not an initializer"},
      {"a statistic of rank 2",
       [&] {
         onnx::ModelProto model = OneNode(inputs, stats());
         model.mutable_graph()->mutable_initializer(2)->add_dims(1);
         return model;
       },
       "tensor 'm' has shape [1, 1]"},
      {"raw bytes short of the shape",
       [&] {
         onnx::ModelProto model = OneNode(inputs, stats());
         model.mutable_graph()->mutable_initializer(2)->set_dims(0, 2);
         return model;
       },
       "holds 4 bytes"},
      {"an integer statistic",
       [&] {
         onnx::ModelProto model = OneNode(inputs, stats());
         model.mutable_graph()->mutable_initializer(0)->set_data_type(
             onnx::TensorProto::INT32);
         return model;
       },
       "data type 6"},
      {"negative variance",
       [&] {
         std::vector<onnx::TensorProto> some = stats();
         some[3] = RawFloats("v", {-1});
         return OneNode(inputs, some);
       },
       "'v' has -1 at [0]"},
      {"channel counts disagree",
       [&] {
         std::vector<onnx::TensorProto> some = stats();
         some[0] = RawFloats("w", {1, 1});
         return OneNode(inputs, some);
       },
       "'w' has 2 values"},
      {"too few inputs",
       [&] {
         return OneNode({"x", "w", "b"}, stats());
       },
       "3 inputs"},
      {"no BatchNormalization node",
       [] {
         onnx::ModelProto model;
         model.mutable_graph()->add_node()->set_op_type("Conv");
         return model;
       },
       "TrainingMode.PRESERVE"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const absl::Status status = LayersFromOnnx(c.model(), "m.onnx").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_EQ(status.message().substr(0, 8), "m.onnx: ") << status;
    EXPECT_NE(status.message().find(c.mentions), std::string::npos) << status;
  }
  const std::string dir =
      testing::FreshTempDir("normd_checkpoint_test", "onnx");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/junk.onnx") << "\xff\xff\xff not a protobuf";
  EXPECT_NE(ReadCheckpoint(dir + "/junk.onnx", kDefaultMaxHeaderBytes)
                .status()
                .message()
                .find("not an ONNX model"),
            std::string::npos);
}

}  // namespace
}  // namespace normd::client

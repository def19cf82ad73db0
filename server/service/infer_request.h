// The Open Inference Protocol's (KServe v2) infer request and reply, as the
// service takes them from any front end: the gRPC service translates its
// protobuf messages into these, the REST front end its JSON and binary
// bodies. Tensor elements always arrive as raw little-endian bytes of their
// datatype, so that the front ends' own forms (typed contents, JSON numbers)
// never reach the service. Plain values; thread-compatible.
#ifndef NORMD_SERVER_SERVICE_INFER_REQUEST_H_
#define NORMD_SERVER_SERVICE_INFER_REQUEST_H_

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "server/core/tensor.h"
#include "server/service/tensor_bytes.h"

namespace normd {

// A parameter's value: none (a protobuf InferParameter with no value set),
// a bool, an integer, a double or a string (what both protobuf's
// InferParameter and JSON can hold).
using InferValue =
    std::variant<std::monostate, bool, int64_t, double, std::string>;

struct InferParameter {
  std::string name;
  InferValue value;
};
// Names are unique (the front ends refuse a name given twice).
using InferParameters = std::vector<InferParameter>;

struct InferInput {
  std::string name;
  std::string datatype;
  Shape shape;
  InferParameters parameters;
  TensorBytes data;
  // How error messages name where `data` came from in the request, e.g.
  // "raw_input_contents[0]" or "inputs[0].data".
  std::string data_field;
};

struct InferRequestedOutput {
  std::string name;
  InferParameters parameters;
};

struct InferRequest {
  std::string model_name;
  std::string model_version;  // "" or "1".
  std::string id;
  InferParameters parameters;
  std::vector<InferInput> inputs;
  std::vector<InferRequestedOutput> outputs;
};

// The output an infer request will produce, so that its front end can place
// it: the input's datatype and shape (no output for a fit).
struct InferOutputPlan {
  bool has_output = true;
  std::string datatype;
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t elements = 0;
  int64_t bytes = 0;
};

// What a BatchNorm model's reply carries besides its output.
struct ModelCounters {
  int64_t num_batches_tracked = 0;
  uint64_t generation = 0;
};

// The reply to an infer request; the output's elements are where the front
// end placed them.
struct InferReply {
  InferOutputPlan output;
  std::optional<ModelCounters> counters;  // BatchNorm models only.
};

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_INFER_REQUEST_H_

// The service benchmark's load generator: drives Normalize (unary),
// NormalizeStream (bidi), Fit, or the Open Inference Protocol's ModelInfer
// (raw contents; --rpc=oip) on any server that speaks normd.v1.Normalizer —
// normd, bench/echo_server or the Python peer — through a GenericStub with one
// request serialized up front, keeping --inflight calls (or stream messages)
// in flight for --duration seconds after a --warmup. Prints one JSON object:
// calls, qps, MB/s of request payload, p50/p99 latency. --rpc=rest_json and
// --rpc=rest_binary post the same LayerNorm to normd's Open Inference
// Protocol REST port (--http_target) instead: JSON numbers, or Triton's
// binary data both ways; one keep-alive connection and thread per call in
// flight.
//
//   build/bench/loadgen --target=127.0.0.1:50051 --shape=1,768 --inflight=16
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/buffer.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "inference/grpc_predict_v2.pb.h"
#include "normd/v1/normalizer.grpc.pb.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Server address.");
ABSL_FLAG(std::string, http_target, "127.0.0.1:8000",
          "REST address (host:port) for --rpc=rest_json and rest_binary.");
ABSL_FLAG(std::string, rpc, "unary",
          "unary (Normalize), stream (NormalizeStream), fit (Fit of "
          "--model), oip (the Open Inference Protocol's ModelInfer of "
          "layer_norm, or of --model with --mode=batch_norm, raw contents), "
          "rest_json or rest_binary (the same LayerNorm over REST).");
ABSL_FLAG(std::string, mode, "layer_norm", "layer_norm or batch_norm (eval).");
ABSL_FLAG(std::string, shape, "1,768", "Input shape (fp32), comma-separated.");
ABSL_FLAG(std::string, model, "bench",
          "BatchNorm model name; created (C = shape[1]) if "
          "--create_model.");
ABSL_FLAG(bool, create_model, false,
          "Create --model first (ALREADY_EXISTS is fine).");
ABSL_FLAG(bool, set_reference, false,
          "With --create_model: give --model a drift reference (its running "
          "statistics), so that every request is observed.");
ABSL_FLAG(int, inflight, 1, "Calls (or stream messages) kept in flight.");
ABSL_FLAG(int, streams, 1,
          "With --rpc=stream: streams sharing the --inflight messages.");
ABSL_FLAG(int, channels, 1, "gRPC channels (TCP connections) to spread over.");
ABSL_FLAG(double, duration, 3.0, "Measured seconds.");
ABSL_FLAG(double, warmup, 0.5, "Seconds before measuring starts.");

namespace normd {
namespace {

using Clock = std::chrono::steady_clock;

// Per-caller results; merged at the end. Each is written by one call chain
// at a time.
struct Tally {
  std::vector<double> latencies_us;
  int64_t calls = 0;
};

// The run's clock and shared error state. Thread-safe.
class Run {
 public:
  Run(double warmup, double duration)
      : measure_from_(Clock::now() + ToDuration(warmup)),
        end_(measure_from_ + ToDuration(duration)) {}

  bool Measuring(Clock::time_point t) const { return t >= measure_from_; }
  bool Over(Clock::time_point t) const {
    return t >= end_ || failed_.load(std::memory_order_relaxed);
  }
  void Fail(const std::string& what) {
    absl::MutexLock lock(&mu_);
    if (error_.empty()) error_ = what;
    failed_ = true;
  }
  std::string error() {
    absl::MutexLock lock(&mu_);
    return error_;
  }
  void Record(Tally& tally, Clock::time_point start, Clock::time_point end) {
    if (!Measuring(start) || end > end_) return;
    tally.calls++;
    tally.latencies_us.push_back(
        std::chrono::duration<double, std::micro>(end - start).count());
  }
  // Done-latch for the callers.
  void AddCaller() {
    absl::MutexLock lock(&mu_);
    ++active_;
  }
  void CallerDone() {
    absl::MutexLock lock(&mu_);
    --active_;
  }
  void WaitAllDone() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](int* active) { return *active == 0; }, &active_));
  }

 private:
  static Clock::duration ToDuration(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(seconds));
  }
  const Clock::time_point measure_from_;
  const Clock::time_point end_;
  std::atomic<bool> failed_{false};
  absl::Mutex mu_;
  std::string error_ ABSL_GUARDED_BY(mu_);
  int active_ ABSL_GUARDED_BY(mu_) = 0;
};

// One unary call chain: issues the next call when the previous completes.
class UnaryCaller {
 public:
  UnaryCaller(grpc::GenericStub& stub, const std::string& method,
              const grpc::ByteBuffer& request, Run& run)
      : stub_(stub), method_(method), request_(request), run_(run) {}

  void Start() {
    run_.AddCaller();
    Issue();
  }
  Tally& tally() { return tally_; }

 private:
  void Issue() {
    context_ = std::make_unique<grpc::ClientContext>();
    start_ = Clock::now();
    stub_.UnaryCall(context_.get(), method_, grpc::StubOptions(), &request_,
                    &response_,
                    [this](grpc::Status status) { OnDone(status); });
  }
  void OnDone(const grpc::Status& status) {
    const Clock::time_point now = Clock::now();
    if (!status.ok()) {
      run_.Fail(absl::StrCat(method_, ": ", status.error_code(), " ",
                             status.error_message()));
    } else {
      run_.Record(tally_, start_, now);
    }
    response_.Clear();
    if (run_.Over(now)) {
      run_.CallerDone();
      return;
    }
    Issue();
  }

  grpc::GenericStub& stub_;
  const std::string method_;
  const grpc::ByteBuffer request_;  // Own reference to the shared slices.
  Run& run_;
  std::unique_ptr<grpc::ClientContext> context_;
  grpc::ByteBuffer response_;
  Clock::time_point start_;
  Tally tally_;
};

// One NormalizeStream: keeps up to `window` messages written but not yet
// answered; answers come back in order. Reads and writes complete on
// different threads, so the bookkeeping is under a mutex and the gRPC calls
// are made after releasing it.
class StreamCaller final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamCaller(grpc::GenericStub& stub, const grpc::ByteBuffer& request,
               int window, Run& run)
      : request_(request), window_(window), run_(run) {
    stub.PrepareBidiStreamingCall(&context_,
                                  "/normd.v1.Normalizer/NormalizeStream",
                                  grpc::StubOptions(), this);
  }

  void Start() {
    run_.AddCaller();
    StartRead(&response_);
    Act(TryWriteLocked());
    StartCall();
  }
  Tally& tally() { return tally_; }

  void OnWriteDone(bool ok) override {
    Action action;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) return;  // The call is failing; OnDone reports it.
      action = TryWriteLocked();
    }
    Act(action);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    const Clock::time_point now = Clock::now();
    Action action;
    {
      absl::MutexLock lock(&mu_);
      run_.Record(tally_, starts_.front(), now);
      starts_.pop_front();
      --outstanding_;
      if (run_.Over(now)) stopping_ = true;
      action = TryWriteLocked();
      action.read = outstanding_ > 0 || !stopping_;
    }
    Act(action);
  }

  void OnDone(const grpc::Status& status) override {
    if (!status.ok()) {
      run_.Fail(absl::StrCat("NormalizeStream: ", status.error_code(), " ",
                             status.error_message()));
    }
    run_.CallerDone();
  }

 private:
  struct Action {
    bool write = false;
    bool read = false;
    bool writes_done = false;
  };

  Action TryWriteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Action action;
    if (!writing_ && !stopping_ && outstanding_ < window_) {
      writing_ = true;
      ++outstanding_;
      starts_.push_back(Clock::now());
      action.write = true;
    } else if (stopping_ && outstanding_ == 0 && !writing_ && !closed_) {
      closed_ = true;
      action.writes_done = true;
    }
    return action;
  }
  void Act(const Action& action) {
    if (action.read) StartRead(&response_);
    if (action.write) StartWrite(&request_);
    if (action.writes_done) StartWritesDone();
  }

  grpc::ClientContext context_;
  const grpc::ByteBuffer request_;
  const int window_;
  Run& run_;
  grpc::ByteBuffer response_;
  absl::Mutex mu_;
  std::deque<Clock::time_point> starts_ ABSL_GUARDED_BY(mu_);
  int outstanding_ ABSL_GUARDED_BY(mu_) = 0;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  Tally tally_;
};

bool ParseShape(const std::string& text, std::vector<int64_t>& shape) {
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(part, &dim) || dim < 1) return false;
    shape.push_back(dim);
  }
  return !shape.empty();
}

// Fills `input` with `shape` fp32 normal(1, 2) values.
void FillInput(const std::vector<int64_t>& shape, v1::Tensor& input) {
  input.set_dtype(v1::FLOAT32);
  int64_t count = 1;
  for (int64_t d : shape) {
    input.add_shape(d);
    count *= d;
  }
  std::vector<float> values(count);
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(1.0f, 2.0f);
  for (float& v : values) v = dist(gen);
  input.set_data(values.data(), values.size() * sizeof(float));
}

grpc::ByteBuffer SerializeRequest(const std::vector<int64_t>& shape,
                                  bool batch_norm, bool fit, bool oip,
                                  const std::string& model) {
  std::string bytes;
  if (oip) {  // The same tensor as the native request, as raw contents.
    inference::ModelInferRequest request;
    request.set_model_name(batch_norm ? model : "layer_norm");
    inference::ModelInferRequest::InferInputTensor& input =
        *request.add_inputs();
    input.set_name("input");
    input.set_datatype("FP32");
    v1::Tensor tensor;
    FillInput(shape, tensor);
    *input.mutable_shape() = tensor.shape();
    request.add_raw_input_contents(tensor.data());
    bytes = request.SerializeAsString();
  } else if (fit) {
    v1::FitRequest request;
    request.set_model(model);
    FillInput(shape, *request.mutable_input());
    bytes = request.SerializeAsString();
  } else {
    v1::NormalizeRequest request;
    request.set_mode(batch_norm ? v1::BATCH_NORM : v1::LAYER_NORM);
    if (batch_norm) request.set_model(model);
    FillInput(shape, *request.mutable_input());
    bytes = request.SerializeAsString();
  }
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// The body of a REST LayerNorm of `shape` (FillInput's values): JSON
// numbers, or the binary-data extension (JSON head, then the bytes; its
// length in `header_length`).
std::string RestBody(const std::vector<int64_t>& shape, bool binary,
                     std::string& header_length) {
  v1::Tensor tensor;
  FillInput(shape, tensor);
  std::string head =
      R"({"inputs":[{"name":"input","datatype":"FP32","shape":[)";
  for (size_t i = 0; i < shape.size(); ++i) {
    absl::StrAppend(&head, i > 0 ? "," : "", shape[i]);
  }
  if (binary) {
    absl::StrAppend(&head, R"(],"parameters":{"binary_data_size":)",
                    tensor.data().size(),
                    R"(}}],"outputs":[{"name":"output","parameters":)"
                    R"({"binary_data":true}}]})");
    header_length = std::to_string(head.size());
    return head + tensor.data();
  }
  head += R"(],"data":[)";
  const size_t count = tensor.data().size() / sizeof(float);
  for (size_t i = 0; i < count; ++i) {
    float value;
    std::memcpy(&value, tensor.data().data() + i * sizeof(float),
                sizeof(value));
    absl::StrAppend(&head, i > 0 ? "," : "", value);
  }
  return head + "]}]}";
}

// --inflight threads, each posting `body` on its own keep-alive connection
// (a blocking Beast client: one thread per connection, as HTTP/1.1 clients
// work) until the run is over.
void RunRest(const std::string& target, const std::string& body,
             const std::string& header_length, int inflight, Run& run,
             std::vector<Tally>& tallies) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  const std::vector<std::string> host_port = absl::StrSplit(target, ':');
  if (host_port.size() != 2) {
    run.Fail("--http_target must be host:port");
    return;
  }
  tallies.resize(static_cast<size_t>(inflight));
  std::vector<std::thread> threads;
  for (int i = 0; i < inflight; ++i) {
    threads.emplace_back([&, i] {
      asio::io_context io;
      asio::ip::tcp::socket socket(io);
      boost::system::error_code ec;
      asio::connect(
          socket,
          asio::ip::tcp::resolver(io).resolve(host_port[0], host_port[1], ec),
          ec);
      if (ec) {
        run.Fail(absl::StrCat("HTTP: cannot connect to ", target, ": ",
                              ec.message()));
        return;
      }
      socket.set_option(asio::ip::tcp::no_delay(true), ec);
      // The body is sent from where it is, not copied per request.
      http::request<http::span_body<const char>> request(
          http::verb::post, "/v2/models/layer_norm/infer", 11);
      request.set(http::field::host, host_port[0]);
      request.set(http::field::content_type, header_length.empty()
                                                 ? "application/json"
                                                 : "application/octet-stream");
      if (!header_length.empty()) {
        request.set("Inference-Header-Content-Length", header_length);
      }
      request.body() = boost::beast::span<const char>(body.data(), body.size());
      request.prepare_payload();
      boost::beast::flat_buffer buffer;
      // The answer's body, read straight from the socket into a buffer
      // kept from call to call, as an efficient client does (Beast's string
      // body would zero-fill it and copy it through its read buffer).
      std::vector<char> answer;
      while (!run.Over(Clock::now())) {
        const Clock::time_point start = Clock::now();
        http::response_parser<http::empty_body> response;
        http::write(socket, request, ec);
        if (!ec) http::read_header(socket, buffer, response, ec);
        const size_t length =
            ec ? 0 : static_cast<size_t>(response.content_length().value_or(0));
        if (!ec) {
          if (answer.size() < length) answer.resize(length);
          const size_t buffered = std::min(buffer.size(), length);
          asio::buffer_copy(asio::buffer(answer.data(), buffered),
                            buffer.data());
          buffer.consume(buffered);
          asio::read(socket,
                     asio::buffer(answer.data() + buffered, length - buffered),
                     ec);
        }
        if (ec || response.get().result_int() != 200) {
          run.Fail(ec ? absl::StrCat("HTTP: ", ec.message())
                      : absl::StrCat(
                            "HTTP ", response.get().result_int(), ": ",
                            absl::string_view(answer.data(),
                                              std::min<size_t>(length, 200))));
          return;
        }
        run.Record(tallies[static_cast<size_t>(i)], start, Clock::now());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

double Percentile(std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t index =
      std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()));
  return sorted[index];
}

int Main() {
  std::vector<int64_t> shape;
  if (!ParseShape(absl::GetFlag(FLAGS_shape), shape)) {
    std::fprintf(stderr, "loadgen: --shape must be positive integers\n");
    return 2;
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const std::string rpc = absl::GetFlag(FLAGS_rpc);
  const int inflight = absl::GetFlag(FLAGS_inflight);
  const int streams = absl::GetFlag(FLAGS_streams);
  const int channel_count = absl::GetFlag(FLAGS_channels);
  if ((mode != "layer_norm" && mode != "batch_norm") ||
      (rpc != "unary" && rpc != "stream" && rpc != "fit" && rpc != "oip" &&
       rpc != "rest_json" && rpc != "rest_binary") ||
      inflight < 1 || streams < 1 || streams > inflight || channel_count < 1) {
    std::fprintf(stderr,
                 "loadgen: bad --mode, --rpc, --inflight, --streams or "
                 "--channels (see --help)\n");
    return 2;
  }
  const bool fit = rpc == "fit";
  const bool batch_norm = mode == "batch_norm" || fit;
  if (batch_norm && shape.size() < 2) {
    std::fprintf(stderr, "loadgen: batch_norm needs rank >= 2\n");
    return 2;
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int i = 0; i < channel_count; ++i) {
    // A distinct argument keeps gRPC from sharing one subchannel.
    args.SetInt("normd.loadgen.channel", i);
    channels.push_back(grpc::CreateCustomChannel(
        absl::GetFlag(FLAGS_target), grpc::InsecureChannelCredentials(), args));
    stubs.push_back(std::make_unique<grpc::GenericStub>(channels.back()));
  }
  const std::string model = absl::GetFlag(FLAGS_model);
  if (batch_norm && absl::GetFlag(FLAGS_create_model)) {
    auto stub = v1::Normalizer::NewStub(channels[0]);
    grpc::ClientContext context;
    v1::CreateModelRequest create;
    create.set_name(model);
    create.set_num_features(shape[1]);
    v1::ModelState state;
    const grpc::Status status = stub->CreateModel(&context, create, &state);
    if (!status.ok() &&
        status.error_code() != grpc::StatusCode::ALREADY_EXISTS) {
      std::fprintf(stderr, "loadgen: CreateModel: %s\n",
                   status.error_message().c_str());
      return 1;
    }
    if (absl::GetFlag(FLAGS_set_reference)) {
      grpc::ClientContext reference_context;
      v1::SetReferenceRequest reference;
      reference.set_model(model);
      reference.set_source(v1::REFERENCE_RUNNING);
      const grpc::Status set =
          stub->SetReference(&reference_context, reference, &state);
      if (!set.ok()) {
        std::fprintf(stderr, "loadgen: SetReference: %s\n",
                     set.error_message().c_str());
        return 1;
      }
    }
  }
  const grpc::ByteBuffer request =
      SerializeRequest(shape, batch_norm, fit, rpc == "oip", model);

  Run run(absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_duration));
  std::vector<Tally*> tallies;
  std::vector<Tally> rest_tallies;
  std::string rest_body;
  std::vector<std::unique_ptr<UnaryCaller>> unary;
  std::vector<std::unique_ptr<StreamCaller>> stream;
  if (rpc == "rest_json" || rpc == "rest_binary") {
    std::string header_length;
    rest_body = RestBody(shape, rpc == "rest_binary", header_length);
    RunRest(absl::GetFlag(FLAGS_http_target), rest_body, header_length,
            inflight, run, rest_tallies);
    for (Tally& tally : rest_tallies) tallies.push_back(&tally);
  } else if (rpc != "stream") {
    const std::string method =
        rpc == "oip" ? "/inference.GRPCInferenceService/ModelInfer"
        : fit        ? "/normd.v1.Normalizer/Fit"
                     : "/normd.v1.Normalizer/Normalize";
    for (int i = 0; i < inflight; ++i) {
      unary.push_back(std::make_unique<UnaryCaller>(*stubs[i % stubs.size()],
                                                    method, request, run));
      tallies.push_back(&unary.back()->tally());
    }
    for (auto& caller : unary) caller->Start();
  } else {
    for (int i = 0; i < streams; ++i) {
      const int window = inflight / streams + (i < inflight % streams);
      stream.push_back(std::make_unique<StreamCaller>(*stubs[i % stubs.size()],
                                                      request, window, run));
      tallies.push_back(&stream.back()->tally());
    }
    for (auto& caller : stream) caller->Start();
  }
  if (rest_body.empty()) run.WaitAllDone();
  const std::string error = run.error();
  if (!error.empty()) {
    std::fprintf(stderr, "loadgen: %s\n", error.c_str());
    return 1;
  }
  std::vector<double> latencies;
  int64_t calls = 0;
  for (Tally* tally : tallies) {
    calls += tally->calls;
    latencies.insert(latencies.end(), tally->latencies_us.begin(),
                     tally->latencies_us.end());
  }
  std::sort(latencies.begin(), latencies.end());
  const double seconds = absl::GetFlag(FLAGS_duration);
  const double qps = calls / seconds;
  const size_t request_bytes =
      rest_body.empty() ? request.Length() : rest_body.size();
  std::printf(
      "{\"calls\": %lld, \"qps\": %.1f, \"mb_per_s\": %.2f, "
      "\"request_bytes\": %zu, \"p50_us\": %.1f, \"p99_us\": %.1f}\n",
      static_cast<long long>(calls), qps, qps * request_bytes / 1e6,
      request_bytes, Percentile(latencies, 0.5), Percentile(latencies, 0.99));
  return 0;
}

}  // namespace
}  // namespace normd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Load generator for normd.v1.Normalizer/Normalize and NormalizeStream "
      "(normd, bench/echo_server, the Python peer); prints JSON");
  absl::ParseCommandLine(argc, argv);
  return normd::Main();
}

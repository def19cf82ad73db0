// The service benchmark's baseline: a gRPC server that answers
// normd.v1.Normalizer/Normalize and /NormalizeStream by sending the request
// bytes straight back (raw ByteBuffers, no protobuf, no compute), built with
// exactly normd's transport settings (ConfigureServerBuilder). Whatever normd
// adds on top of this is its own cost.
//
//   build/bench/echo_server --port=0   # prints "serving gRPC on HOST:PORT"
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "normd/v1/normalizer.grpc.pb.h"
#include "server/malloc_config.h"
#include "server/rpc/grpc_transport.h"

ABSL_FLAG(std::string, bind_address, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 0, "gRPC port (0 picks a free one).");
ABSL_FLAG(int, malloc_arenas, 1,
          "glibc malloc arenas, as normd's flag of that name (same default).");
ABSL_FLAG(int64_t, malloc_keep_freed_bytes, 64 << 20,
          "Freed memory glibc malloc keeps, as normd's flag of that name "
          "(same default).");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20,
          "Largest message accepted or sent, as in normd.");

namespace normd {
namespace {

// Echoes each NormalizeStream message back, one at a time, in order. Driven
// by one gRPC callback at a time.
class EchoStreamReactor final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  EchoStreamReactor() { StartRead(&message_); }
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&message_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::CANCELLED);
      return;
    }
    StartRead(&message_);
  }
  void OnDone() override { delete this; }

 private:
  grpc::ByteBuffer message_;
};

using N = v1::Normalizer;
// Every method on the callback API (no sync threads, like normd); the two the
// load generator drives are raw.
using EchoBase = N::WithRawCallbackMethod_Normalize<
    N::WithRawCallbackMethod_NormalizeStream<N::WithCallbackMethod_Fit<
        N::WithCallbackMethod_CreateModel<N::WithCallbackMethod_GetModel<
            N::WithCallbackMethod_ListModels<N::WithCallbackMethod_DeleteModel<
                N::WithCallbackMethod_ResetModel<
                    N::WithCallbackMethod_FitStream<N::Service>>>>>>>>>;

// Raw echo for the two methods the load generator drives. Stateless.
class EchoService final : public EchoBase {
 public:
  grpc::ServerUnaryReactor* Normalize(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override {
    *response = *request;  // Shares the slices: no copy.
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NormalizeStream(
      grpc::CallbackServerContext* /*context*/) override {
    return new EchoStreamReactor();
  }
};

int Main() {
  // Block the stop signals before gRPC starts threads, so that only sigwait
  // below receives them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  if (absl::Status s = ConfigureMalloc(MallocConfig{
          .arenas = absl::GetFlag(FLAGS_malloc_arenas),
          .keep_freed_bytes = absl::GetFlag(FLAGS_malloc_keep_freed_bytes)});
      absl::IsInvalidArgument(s)) {
    std::fprintf(stderr, "echo_server: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  const std::string bind_address = absl::GetFlag(FLAGS_bind_address);
  const int requested_port = absl::GetFlag(FLAGS_port);
  EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  ConfigureServerBuilder(bind_address, requested_port,
                         absl::GetFlag(FLAGS_max_message_bytes), builder,
                         &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "echo_server: cannot listen on %s\n",
                 HostPort(bind_address, requested_port).c_str());
    return 1;
  }
  std::fprintf(stderr, "echo_server: serving gRPC on %s\n",
               HostPort(bind_address, port).c_str());
  int signal = 0;
  sigwait(&signals, &signal);
  server->Shutdown();
  return 0;
}

}  // namespace
}  // namespace normd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "gRPC raw-ByteBuffer echo of Normalize/NormalizeStream: the service "
      "benchmark's baseline");
  absl::ParseCommandLine(argc, argv);
  return normd::Main();
}

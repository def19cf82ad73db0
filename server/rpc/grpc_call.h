// The service's call lifecycle (server/service/call.h) on gRPC's callback
// API, for every unary method of normd's gRPC services: the token from the
// call's metadata, admission on the request's size, the compute arena for
// large requests, cancellation and deadline from the call's context, the
// durability wait, the service's and gRPC's metrics, and the status as a
// grpc::Status. Header-only templates; each call's state is owned by that
// call.
#ifndef NORMD_SERVER_RPC_GRPC_CALL_H_
#define NORMD_SERVER_RPC_GRPC_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/parallel.h"
#include "server/rpc/grpc_metrics.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_message.h"
#include "server/service/call.h"
#include "server/service/logging.h"
#include "server/service/service.h"

namespace normd {

// What normd's gRPC services share.
struct GrpcFrontEnd {
  Service& service;
  GrpcMetrics& metrics;
};

// Logs server-side faults (not client errors, which are per request).
inline void LogIfServerFault(Method method, const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      Log(LogSeverity::kError,
          absl::StrCat(MethodName(method), " failed: ", status.message()));
      break;
    default:
      break;
  }
}

// One gRPC call or stream: the service's lifecycle and gRPC's metrics.
class GrpcCall {
 public:
  GrpcCall(GrpcFrontEnd& front, Protocol protocol, Method method)
      : call(front.service, protocol, method), metrics_(front.metrics) {
    metrics_.Started(method);
  }
  ~GrpcCall() { Record(absl::CancelledError()); }

  // Records `status` in the metrics (once) and releases the admission.
  void Record(const absl::Status& status) {
    if (call.finished()) return;
    LogIfServerFault(call.method(), status);
    metrics_.Handled(call.method(), status.code(), call.ElapsedSeconds());
    call.Finish(status.code());
  }

  Call call;

 private:
  GrpcMetrics& metrics_;
};

// A unary call and its reactor.
struct UnaryCall : GrpcCall {
  UnaryCall(GrpcFrontEnd& front, Protocol protocol, Method method,
            grpc::CallbackServerContext* call_context)
      : GrpcCall(front, protocol, method),
        reactor(call_context->DefaultReactor()),
        context(call_context) {}
  grpc::ServerUnaryReactor* const reactor;
  grpc::CallbackServerContext* const context;

  // Releases the call's admission and records it, then finishes it:
  // released first, so that a client sending one call at a time is never
  // refused because its last call, already answered, still counts.
  void Finish(const absl::Status& status) {
    Record(status);
    reactor->Finish(ToGrpcStatus(status));
  }
};

// How RunUnary runs a method.
struct UnaryOptions {
  // Large requests run in the compute arena (see kOffloadRequestBytes).
  bool offload = false;
  // The call must carry the bearer token (when one is configured).
  bool authenticate = true;
};

// Completes a unary call: authenticates and admits it, runs `body` (on this
// thread, or in the compute arena when options.offload and the request is
// large; `body` must own or point to everything it uses), finishes it once
// its changes are durable.
template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(GrpcFrontEnd& front, Protocol protocol,
                                   Method method,
                                   grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer& request,
                                   UnaryOptions options, Fn body) {
  auto call = std::make_shared<UnaryCall>(front, protocol, method, context);
  grpc::ServerUnaryReactor* reactor = call->reactor;
  const int64_t request_bytes = static_cast<int64_t>(request.Length());
  absl::Status admitted =
      options.authenticate ? call->call.Authenticate(AuthorizationOf(*context),
                                                     kGrpcTokenCarrier)
                           : absl::OkStatus();
  if (admitted.ok()) admitted = call->call.Admit(request_bytes);
  if (!admitted.ok()) {
    call->Finish(admitted);
    return reactor;
  }
  call->call.set_cancelled_probe([context] { return context->IsCancelled(); });
  auto run = [call, body = std::move(body)] {
    call->call.Run(body, [call](absl::Status status) { call->Finish(status); });
  };
  if (options.offload && request_bytes >= kOffloadRequestBytes) {
    EnqueueCompute(std::move(run));
  } else {
    run();
  }
  return reactor;
}

// RunUnary for a method that takes a `Request` message and answers a
// `Response`: `run(request, response)` between parsing and serializing.
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* RunParsed(GrpcFrontEnd& front, Protocol protocol,
                                    Method method,
                                    grpc::CallbackServerContext* context,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response,
                                    UnaryOptions options, Fn run) {
  return RunUnary(front, protocol, method, context, *request, options,
                  [request, response, run = std::move(run)] {
                    Request parsed;
                    if (absl::Status s = ParseMessage(*request, parsed);
                        !s.ok()) {
                      return s;
                    }
                    Response reply;
                    if (absl::Status s = run(parsed, reply); !s.ok()) return s;
                    return SerializeMessage(reply, *response);
                  });
}

// RunParsed of a method of `object` that takes the parsed request (const or
// not) and fills the response.
template <typename Object, typename RequestParam, typename Response>
grpc::ServerUnaryReactor* RunMember(
    GrpcFrontEnd& front, Protocol protocol, Method method,
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response, UnaryOptions options, Object& object,
    absl::Status (Object::*run)(RequestParam, Response&)) {
  using Request = std::remove_cvref_t<RequestParam>;
  return RunParsed<Request, Response>(
      front, protocol, method, context, request, response, options,
      [&object, run](Request& parsed, Response& reply) {
        return (object.*run)(parsed, reply);
      });
}

}  // namespace normd

#endif  // NORMD_SERVER_RPC_GRPC_CALL_H_

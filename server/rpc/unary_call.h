// The lifecycle of a unary call on the callback API, shared by the gRPC
// services that run on the NormalizerService (normd.v1.Normalizer and the
// Open Inference Protocol): authentication, admission, the compute arena
// for large requests, durability before the reply, metrics, and the status
// mapping. Header-only templates; each call's state is owned by that call.
#ifndef NORMD_SERVER_RPC_UNARY_CALL_H_
#define NORMD_SERVER_RPC_UNARY_CALL_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/core/parallel.h"
#include "server/rpc/logging.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/raw_message.h"
#include "server/rpc/status_mapping.h"

namespace normd {

// Runs a handler body, turning an allocation failure into RESOURCE_EXHAUSTED
// so that no exception crosses into gRPC.
template <typename Fn>
absl::Status Guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        "the server could not allocate memory for this request");
  }
}

// Logs server-side faults (not client errors, which are per request).
inline void LogIfServerFault(const char* method, const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
    case grpc::StatusCode::DATA_LOSS:
      Log(LogSeverity::kError,
          absl::StrCat(method, " failed: ", status.error_message()));
      break;
    default:
      break;
  }
}

// Finishes a unary call with `status`, logged and counted.
inline void FinishUnary(grpc::ServerUnaryReactor* reactor, CallTracker& tracker,
                        const char* name, const absl::Status& status) {
  const grpc::Status grpc_status = ToGrpcStatus(status);
  LogIfServerFault(name, grpc_status);
  tracker.Finish(grpc_status.error_code());
  reactor->Finish(grpc_status);
}

// What a unary call holds from admission to its reply.
struct UnaryCall {
  UnaryCall(NormalizerService& service, RpcMethod method,
            grpc::CallbackServerContext* call_context, const char* method_name)
      : tracker(service.metrics(), method),
        reactor(call_context->DefaultReactor()),
        context(call_context),
        name(method_name) {}
  CallTracker tracker;
  grpc::ServerUnaryReactor* const reactor;
  grpc::CallbackServerContext* const context;
  const char* const name;
  Admission::Ticket ticket;

  // Releases the call's admission, then finishes it: released first, so
  // that a client sending one call at a time is never refused because its
  // last call, already answered, still counts.
  void Finish(const absl::Status& status) {
    ticket.Release();
    FinishUnary(reactor, tracker, name, status);
  }
};

// Runs `body` and finishes the call with its status. A call whose client
// has gone (cancelled, or past its deadline) is not run. A body that changed
// models finishes only once its changes are durable (with --state_dir): it
// runs in a DeferDurability scope, and the log's thread finishes the call,
// so that no gRPC thread blocks on a disk sync.
template <typename Fn>
void CompleteUnary(std::shared_ptr<UnaryCall> call, ModelStore& store,
                   const Fn& body) {
  if (call->context->IsCancelled()) {
    call->Finish(absl::CancelledError(
        "the call was cancelled or its deadline passed before it ran"));
    return;
  }
  absl::Status status;
  uint64_t sequence = 0;
  {
    DeferDurability defer;
    status = Guarded(body);
    sequence = defer.sequence();
  }
  if (!status.ok() || sequence == 0) {
    call->Finish(status);
    return;
  }
  store.OnDurable(
      sequence, [call](const absl::Status& durable) { call->Finish(durable); });
}

// Admits a call of `request_bytes` (authenticated unless the method needs
// no token), or refuses it with UNAUTHENTICATED or RESOURCE_EXHAUSTED and
// finishes it (false).
inline bool AdmitUnary(NormalizerService& service, UnaryCall& call,
                       int64_t request_bytes, bool authenticate) {
  if (absl::Status s =
          authenticate ? service.Authenticate(*call.context) : absl::OkStatus();
      !s.ok()) {
    FinishUnary(call.reactor, call.tracker, call.name, s);
    return false;
  }
  absl::StatusOr<Admission::Ticket> ticket =
      service.admission().Admit(1, request_bytes);
  if (!ticket.ok()) {
    service.metrics().Rejected();
    FinishUnary(call.reactor, call.tracker, call.name, ticket.status());
    return false;
  }
  call.ticket = std::move(*ticket);
  return true;
}

// Requests at least this large are computed in the compute arena rather than
// on the gRPC callback thread that received them, so that one big tensor
// never holds up the threads serving everyone else; smaller ones are cheaper
// to compute in place than to hand over.
inline constexpr size_t kOffloadRequestBytes = 256 << 10;

// How RunUnary runs a method.
struct UnaryOptions {
  // Large requests run in the compute arena (see kOffloadRequestBytes).
  bool offload = false;
  // The call must carry the bearer token (when one is configured).
  bool authenticate = true;
};

// Completes a unary call: admits it, runs `body` (on this thread, or in the
// compute arena when options.offload and the request is large; `body` must
// own or point to everything it uses), records the metrics, finishes.
template <typename Fn>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context,
                                   NormalizerService& service, RpcMethod method,
                                   const char* name,
                                   const grpc::ByteBuffer& request,
                                   UnaryOptions options, Fn body) {
  auto call = std::make_shared<UnaryCall>(service, method, context, name);
  grpc::ServerUnaryReactor* reactor = call->reactor;
  const size_t request_bytes = request.Length();
  if (!AdmitUnary(service, *call, static_cast<int64_t>(request_bytes),
                  options.authenticate)) {
    return reactor;
  }
  if (options.offload && request_bytes >= kOffloadRequestBytes) {
    EnqueueCompute([call = std::move(call), &service, body = std::move(body)] {
      CompleteUnary(call, service.store(), body);
    });
  } else {
    CompleteUnary(std::move(call), service.store(), body);
  }
  return reactor;
}

// RunUnary for a method that takes a `Request` message and answers a
// `Response`: `run(request, response)` between parsing and serializing.
template <typename Request, typename Response, typename Fn>
grpc::ServerUnaryReactor* RunParsed(grpc::CallbackServerContext* context,
                                    NormalizerService& service,
                                    RpcMethod method, const char* name,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response,
                                    UnaryOptions options, Fn run) {
  return RunUnary(context, service, method, name, *request, options,
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
    grpc::CallbackServerContext* context, NormalizerService& service,
    RpcMethod method, const char* name, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response, UnaryOptions options, Object& object,
    absl::Status (Object::*run)(RequestParam, Response&)) {
  using Request = std::remove_cvref_t<RequestParam>;
  return RunParsed<Request, Response>(
      context, service, method, name, request, response, options,
      [&object, run](Request& parsed, Response& reply) {
        return (object.*run)(parsed, reply);
      });
}

}  // namespace normd

#endif  // NORMD_SERVER_RPC_UNARY_CALL_H_

#include "server/rpc/health_service.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_message.h"

namespace normd {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// One Watch stream: writes the latest status whenever it changes (statuses
// that change faster than the client reads are coalesced to the newest), and
// finishes after the final NOT_SERVING at shutdown or on cancellation.
class HealthService::Watcher final
    : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  Watcher(HealthService& service, std::string name)
      : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  // Queues `status` (and, if `last`, the end of the stream).
  void Notify(ServingStatus status, bool last) {
    MutexLock lock(&mu_);
    if (finished_) return;
    pending_ = status;
    has_pending_ = true;
    finish_after_pending_ |= last;
    if (!writing_) WriteNextLocked();
  }

  void OnWriteDone(bool ok) override {
    MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    MutexLock lock(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_.Unregister(this);
    delete this;
  }

  // Ends a stream whose request could not be parsed (before Register).
  void Refuse(const grpc::Status& status) {
    MutexLock lock(&mu_);
    FinishLocked(status);
  }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (has_pending_) {
      has_pending_ = false;
      HealthCheckResponse response;
      response.set_status(pending_);
      raw_response_.Clear();
      if (!SerializeMessage(response, raw_response_).ok()) {
        FinishLocked(grpc::Status(grpc::StatusCode::INTERNAL,
                                  "cannot serialize the status"));
        return;
      }
      writing_ = true;
      StartWrite(&raw_response_);
      return;
    }
    if (finish_after_pending_) FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || writing_) {
      // A write in flight: OnWriteDone finishes (ok=false after a cancel).
      if (!finished_ && !status.ok()) finish_after_pending_ = true;
      return;
    }
    finished_ = true;
    Finish(status);
  }

  HealthService& service_;
  const std::string name_;
  Mutex mu_;
  grpc::ByteBuffer raw_response_ ABSL_GUARDED_BY(mu_);
  ServingStatus pending_ ABSL_GUARDED_BY(mu_) = HealthCheckResponse::UNKNOWN;
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_after_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

HealthService::ServingStatus HealthService::StatusLocked(
    const std::string& service) const {
  auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN
                               : it->second;
}

bool HealthService::IsServing(absl::string_view service) {
  MutexLock lock(&mu_);
  return StatusLocked(std::string(service)) == HealthCheckResponse::SERVING;
}

void HealthService::SetServing(absl::string_view service, bool serving) {
  MutexLock lock(&mu_);
  if (shut_down_) return;
  const ServingStatus status =
      serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
  statuses_[std::string(service)] = status;
  for (Watcher* watcher : watchers_) {
    if (watcher->name() == service) watcher->Notify(status, /*last=*/false);
  }
}

void HealthService::Shutdown() {
  MutexLock lock(&mu_);
  if (shut_down_) return;
  shut_down_ = true;
  for (auto& [name, status] : statuses_) {
    status = HealthCheckResponse::NOT_SERVING;
  }
  for (Watcher* watcher : watchers_) {
    watcher->Notify(HealthCheckResponse::NOT_SERVING, /*last=*/true);
  }
}

void HealthService::Register(Watcher* watcher) {
  MutexLock lock(&mu_);
  watchers_.insert(watcher);
  watcher->Notify(StatusLocked(watcher->name()), /*last=*/shut_down_);
}

void HealthService::Unregister(Watcher* watcher) {
  MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  HealthCheckRequest parsed;
  absl::Status status = ParseMessage(*request, parsed);
  HealthCheckResponse reply;
  if (status.ok()) {
    MutexLock lock(&mu_);
    const ServingStatus serving = StatusLocked(parsed.service());
    if (serving == HealthCheckResponse::SERVICE_UNKNOWN) {
      status = absl::NotFoundError(
          absl::StrCat("service: unknown service '", parsed.service(), "'"));
    } else {
      reply.set_status(serving);
    }
  }
  if (status.ok()) status = SerializeMessage(reply, *response);
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* HealthService::Watch(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  HealthCheckRequest parsed;
  const absl::Status status = ParseMessage(*request, parsed);
  auto* watcher = new Watcher(*this, parsed.service());
  if (!status.ok()) {
    watcher->Refuse(ToGrpcStatus(status));
  } else {
    Register(watcher);
  }
  return watcher;
}

}  // namespace normd

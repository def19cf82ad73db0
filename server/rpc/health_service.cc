#include "server/rpc/health_service.h"

#include "absl/strings/str_cat.h"

namespace normd {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// One Watch stream: writes the latest status whenever it changes (statuses
// that change faster than the client reads are coalesced to the newest), and
// finishes after the final NOT_SERVING at shutdown or on cancellation.
class HealthService::Watcher final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
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

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    if (has_pending_) {
      has_pending_ = false;
      response_.set_status(pending_);
      writing_ = true;
      StartWrite(&response_);
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
  HealthCheckResponse response_ ABSL_GUARDED_BY(mu_);
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
    grpc::CallbackServerContext* context, const HealthCheckRequest* request,
    HealthCheckResponse* response) {
  grpc::Status status;
  {
    MutexLock lock(&mu_);
    const ServingStatus serving = StatusLocked(request->service());
    if (serving == HealthCheckResponse::SERVICE_UNKNOWN) {
      status = grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("service: unknown service '", request->service(), "'"));
    } else {
      response->set_status(serving);
    }
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request) {
  auto* watcher = new Watcher(*this, request->service());
  Register(watcher);
  return watcher;
}

}  // namespace normd

#include "server/service/call.h"

#include <memory>
#include <new>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/core/mutation_log.h"

namespace normd {

absl::Status RunGuarded(absl::FunctionRef<absl::Status()> body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
  } catch (const std::length_error&) {
  }
  return absl::ResourceExhaustedError(
      "the server could not allocate memory for this request; retry later, "
      "or lower --max_inflight_bytes so that fewer requests are held at "
      "once");
}

Call::Call(Service& service, Protocol protocol, Method method)
    : service_(service),
      protocol_(protocol),
      method_(method),
      start_(std::chrono::steady_clock::now()) {
  service_.metrics().AddInflight(1);
}

Call::~Call() {
  if (!finished_) Finish(absl::StatusCode::kCancelled);
}

absl::Status Call::Authenticate(std::optional<absl::string_view> authorization,
                                TokenCarrier carrier) const {
  return CheckBearerToken(authorization, service_.options().auth_token,
                          carrier);
}

absl::Status Call::Admit(int64_t bytes) {
  ticket_.Release();
  absl::StatusOr<Admission::Ticket> ticket =
      service_.admission().Admit(1, bytes);
  if (!ticket.ok()) {
    service_.metrics().Rejected();
    return ticket.status();
  }
  ticket_ = *std::move(ticket);
  return absl::OkStatus();
}

absl::Status Call::AdmitMore(int64_t bytes) {
  absl::Status status = service_.admission().Grow(ticket_, bytes);
  if (!status.ok()) service_.metrics().Rejected();
  return status;
}

void Call::Run(absl::FunctionRef<absl::Status()> body,
               absl::AnyInvocable<void(absl::Status) &&> done) {
  if (cancelled_ && cancelled_()) {
    std::move(done)(absl::CancelledError(
        "the call was cancelled or its deadline passed before it ran"));
    return;
  }
  if (absl::Now() > deadline_) {
    std::move(done)(absl::DeadlineExceededError(
        "the call's deadline passed before it ran"));
    return;
  }
  Deferred result = RunDeferred(body);
  if (!result.status.ok()) {
    std::move(done)(std::move(result.status));
    return;
  }
  WhenDurable(result.sequence, std::move(done));
}

Call::Deferred Call::RunDeferred(absl::FunctionRef<absl::Status()> body) {
  DeferDurability defer;
  Deferred result;
  result.status = RunGuarded(body);
  result.sequence = defer.sequence();
  return result;
}

void Call::WhenDurable(uint64_t sequence,
                       absl::AnyInvocable<void(absl::Status) &&> done) {
  if (sequence == 0) {
    std::move(done)(absl::OkStatus());
    return;
  }
  // The store keeps a copyable callback; `done` is moved only once.
  auto pending = std::make_shared<decltype(done)>(std::move(done));
  service_.store().OnDurable(sequence, [pending](absl::Status durable) {
    std::move (*pending)(std::move(durable));
  });
}

void Call::Finish(absl::StatusCode code) {
  ticket_.Release();
  if (finished_) return;
  finished_ = true;
  service_.metrics().AddInflight(-1);
  service_.metrics().Handled(protocol_, method_, code, ElapsedSeconds());
}

double Call::ElapsedSeconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                       start_)
      .count();
}

}  // namespace normd

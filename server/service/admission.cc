#include "server/service/admission.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace normd {
namespace {

absl::Status BytesRefused(int64_t others, int64_t bytes, int64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "server overloaded: calls in progress hold ", others,
      " request bytes and this one ", bytes,
      ", the limit (--max_inflight_bytes) is ", limit, "; retry with backoff"));
}

}  // namespace

Admission::Ticket& Admission::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    admission_ = std::exchange(other.admission_, nullptr);
    requests_ = std::exchange(other.requests_, 0);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

void Admission::Ticket::Release() {
  if (admission_ == nullptr) return;
  admission_->requests_.fetch_sub(requests_);
  admission_->bytes_.fetch_sub(bytes_);
  admission_ = nullptr;
  requests_ = 0;
  bytes_ = 0;
}

Admission::Admission(int64_t max_requests, int64_t max_request_bytes)
    : max_requests_(max_requests), max_bytes_(max_request_bytes) {}

absl::StatusOr<Admission::Ticket> Admission::Admit(int64_t requests,
                                                   int64_t bytes) {
  const int64_t now_requests = requests_.fetch_add(requests) + requests;
  const int64_t now_bytes = bytes_.fetch_add(bytes) + bytes;
  Ticket ticket;
  ticket.admission_ = this;
  ticket.requests_ = requests;
  ticket.bytes_ = bytes;
  if (max_requests_ > 0 && requests > 0 && now_requests > max_requests_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "server overloaded: ", now_requests - requests,
        " calls in progress, the limit (--max_inflight_requests) is ",
        max_requests_, "; retry with backoff"));
  }
  if (max_bytes_ > 0 && now_bytes > max_bytes_ && now_bytes != bytes) {
    return BytesRefused(now_bytes - bytes, bytes, max_bytes_);
  }
  return ticket;
}

absl::Status Admission::Grow(Ticket& ticket, int64_t bytes) {
  const int64_t now_bytes = bytes_.fetch_add(bytes) + bytes;
  const int64_t mine = ticket.bytes_ + bytes;
  if (max_bytes_ > 0 && now_bytes > max_bytes_ && now_bytes != mine) {
    bytes_.fetch_sub(bytes);
    return BytesRefused(now_bytes - mine, mine, max_bytes_);
  }
  ticket.bytes_ = mine;
  return absl::OkStatus();
}

}  // namespace normd

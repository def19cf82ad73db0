#include "server/rpc/answering_stream.h"

#include "server/rpc/grpc_status.h"
#include "server/rpc/raw_message.h"

namespace normd {

AnsweringStream::AnsweringStream(StreamWatchdog& watchdog)
    : watchdog_(watchdog) {
  watchdog_.Add(this);
}

void AnsweringStream::OnReadDone(bool ok) {
  if (!StartWorking()) return;  // Ended meanwhile (idle).
  if (!ok) {                    // The client half-closed (or the call broke).
    FinishOnce(absl::OkStatus());
    return;
  }
  Answer(raw_request_);
}

void AnsweringStream::Reply(const google::protobuf::Message& response) {
  raw_response_.Clear();
  if (absl::Status s = SerializeMessage(response, raw_response_); !s.ok()) {
    FinishOnce(s);
    return;
  }
  StartWaiting(Waiting::kForClientToRead, [&] { StartWrite(&raw_response_); });
}

void AnsweringStream::OnWriteDone(bool ok) {
  if (!StartWorking()) return;
  if (!ok) {
    FinishOnce(absl::CancelledError("the client stopped reading"));
    return;
  }
  ReadNext();
}

void AnsweringStream::OnDone() {
  watchdog_.Remove(this);
  OnClosed();
  delete this;
}

void AnsweringStream::ReadNext() {
  StartWaiting(Waiting::kForMessage, [&] { StartRead(&raw_request_); });
}

void AnsweringStream::FinishOnce(const absl::Status& status) {
  if (ClaimFinish()) FinishWith(status);
}

void AnsweringStream::FinishIdle(const absl::Status& status) {
  FinishWith(OnIdleEnd(status));
}

void AnsweringStream::FinishWith(const absl::Status& status) {
  OnFinishing(status);
  Finish(ToGrpcStatus(status));
}

}  // namespace normd

// A bidirectional stream that answers each message with one response, in
// order: it reads a message, hands it to Answer, writes what Answer replies
// (Reply, now or later, from any thread), and reads the next. It finishes OK
// when the client half-closes, CANCELLED when the client stops reading, and,
// through the StreamWatchdog, when it waits on its client for longer than
// the idle timeout. NormalizeStream and reflection are such streams.
//
// Thread-safe as gRPC reactors are: one reaction at a time, plus Reply from
// another thread while no reaction of this stream runs, plus the watchdog
// (see IdleStream). Deletes itself when gRPC is done with it.
#ifndef NORMD_SERVER_RPC_ANSWERING_STREAM_H_
#define NORMD_SERVER_RPC_ANSWERING_STREAM_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "server/rpc/stream_watchdog.h"

namespace normd {

class AnsweringStream
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      public IdleStream {
 public:
  void OnReadDone(bool ok) final;
  void OnWriteDone(bool ok) final;
  void OnDone() final;

 protected:
  explicit AnsweringStream(StreamWatchdog& watchdog);
  ~AnsweringStream() override = default;

  // Reads the first message; call once the stream may proceed.
  void Start() { ReadNext(); }
  // Message `request` arrived: answer it with one Reply, or end the stream
  // with FinishOnce.
  virtual void Answer(const grpc::ByteBuffer& request) = 0;
  // Writes `response`, then reads the next message.
  void Reply(const google::protobuf::Message& response);
  // Ends the stream with `status` unless it has ended.
  void FinishOnce(const absl::Status& status);

  // Told that the watchdog ends the stream with `status`; returns what the
  // client is told (e.g. how far the stream got).
  virtual absl::Status OnIdleEnd(const absl::Status& status) { return status; }
  // Told the status the stream ends with, just before it is sent.
  virtual void OnFinishing(const absl::Status& status) {}
  // Told that gRPC is done with the stream, just before it is deleted.
  virtual void OnClosed() {}

 private:
  void ReadNext();
  void FinishIdle(const absl::Status& status) final;
  void FinishWith(const absl::Status& status);

  StreamWatchdog& watchdog_;
  grpc::ByteBuffer raw_request_;
  grpc::ByteBuffer raw_response_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_ANSWERING_STREAM_H_

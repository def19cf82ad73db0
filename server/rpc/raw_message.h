// Parsing and serializing the protobuf messages of raw gRPC methods: normd's
// services take requests as bytes and parse them themselves, so that bytes
// that are not the method's message get INVALID_ARGUMENT naming the message
// type (gRPC's own parsing answers UNIMPLEMENTED without a word), and a
// garbage message in a stream is told apart from the end of the stream.
// Stateless; thread-safe.
#ifndef NORMD_SERVER_RPC_RAW_MESSAGE_H_
#define NORMD_SERVER_RPC_RAW_MESSAGE_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/proto_utils.h>

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace normd {

// A unary call whose message never arrived (the client cancelled it, or its
// deadline passed, while the message was still on its way) reaches its
// handler with an empty ByteBuffer: CANCELLED, not a server error.
inline absl::Status MessageArrived(const grpc::ByteBuffer& bytes) {
  if (bytes.Valid()) return absl::OkStatus();
  return absl::CancelledError(
      "request: no message arrived (the client cancelled the call, or its "
      "deadline passed, before it was received)");
}

// Parses the serialized `Message` in `bytes` (which keeps its contents):
// INVALID_ARGUMENT "request: not a serialized <type>" if they are not one.
template <typename Message>
absl::Status ParseMessage(const grpc::ByteBuffer& bytes, Message& message) {
  if (absl::Status arrived = MessageArrived(bytes); !arrived.ok()) {
    return arrived;
  }
  grpc::ByteBuffer copy(bytes);  // Shares the slices; parsing consumes it.
  if (!grpc::SerializationTraits<Message>::Deserialize(&copy, &message).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request: not a serialized ", Message::descriptor()->full_name(),
        " (protobuf cannot parse it: malformed wire format, or a string "
        "field that is not UTF-8)"));
  }
  return absl::OkStatus();
}

// The bytes of `message` as views of its slices, which `slices` holds (keep
// it alive while the views are in use); for the raw paths, which read
// tensors in place.
inline absl::Status SliceViews(const grpc::ByteBuffer& message,
                               std::vector<grpc::Slice>& slices,
                               std::vector<absl::string_view>& views) {
  if (absl::Status arrived = MessageArrived(message); !arrived.ok()) {
    return arrived;
  }
  if (!message.Dump(&slices).ok()) {
    return absl::InternalError("request: cannot read the message bytes");
  }
  views.reserve(slices.size());
  for (const grpc::Slice& slice : slices) {
    views.emplace_back(reinterpret_cast<const char*>(slice.begin()),
                       slice.size());
  }
  return absl::OkStatus();
}

// Serializes `message` into `bytes`.
template <typename Message>
absl::Status SerializeMessage(const Message& message, grpc::ByteBuffer& bytes) {
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Message>::Serialize(message, &bytes,
                                                     &own_buffer)
           .ok()) {
    return absl::InternalError(
        absl::StrCat("cannot serialize the ", message.GetTypeName()));
  }
  return absl::OkStatus();
}

}  // namespace normd

#endif  // NORMD_SERVER_RPC_RAW_MESSAGE_H_

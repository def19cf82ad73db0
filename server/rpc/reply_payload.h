// Where a unary gRPC reply's tensor is computed, and the reply assembled
// around it without a protobuf copy: a small payload goes into this
// thread's scratch and is copied, with the fields before and after it, into
// one slice (one allocation, a copy of a few KiB); a large one is computed
// straight into a pooled, uninitialized buffer that becomes the reply's
// middle slice (gRPC gives it back to the pool).
//
// Thread-compatible: a ReplyPayload is used by one call on one thread, and
// its scratch is this thread's until Assemble.
#ifndef NORMD_SERVER_RPC_REPLY_PAYLOAD_H_
#define NORMD_SERVER_RPC_REPLY_PAYLOAD_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>
#include <memory>

#include "absl/strings/string_view.h"
#include "server/service/buffer_pool.h"

namespace normd {

class ReplyPayload {
 public:
  // Outputs up to this size are copied into the reply's one slice (a copy
  // is cheaper than the extra allocations); larger ones become a slice of
  // their own.
  static constexpr int64_t kSmallBytes = 64 << 10;

  explicit ReplyPayload(int64_t bytes)
      : bytes_(bytes),
        pooled_(bytes > kSmallBytes
                    ? AcquirePooled(static_cast<size_t>(bytes))
                    : PooledBuffer(nullptr, &BufferPool::Release)) {}

  // Where the payload is written (its `bytes` bytes).
  void* data() { return bytes_ > kSmallBytes ? pooled_.get() : Scratch(); }

  // The serialized reply: `head`, the payload, `tail`.
  grpc::ByteBuffer Assemble(absl::string_view head, absl::string_view tail) {
    const size_t bytes = static_cast<size_t>(bytes_);
    if (bytes_ <= kSmallBytes) {
      grpc::Slice slice(head.size() + bytes + tail.size());
      char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
      std::memcpy(out, head.data(), head.size());
      if (bytes > 0) std::memcpy(out + head.size(), Scratch(), bytes);
      std::memcpy(out + head.size() + bytes, tail.data(), tail.size());
      return grpc::ByteBuffer(&slice, 1);
    }
    grpc::Slice parts[3];
    size_t count = 0;
    parts[count++] = grpc::Slice(head.data(), head.size());
    parts[count++] =
        grpc::Slice(pooled_.release(), bytes, &BufferPool::Release);
    if (!tail.empty()) parts[count++] = grpc::Slice(tail.data(), tail.size());
    return grpc::ByteBuffer(parts, count);
  }

 private:
  static void* Scratch() {
    thread_local std::unique_ptr<double[]> scratch(
        new double[kSmallBytes / sizeof(double)]);
    return scratch.get();
  }

  const int64_t bytes_;
  PooledBuffer pooled_;
};

}  // namespace normd

#endif  // NORMD_SERVER_RPC_REPLY_PAYLOAD_H_

// One client connection of the REST listener, and the listener classes that
// serve connections through it. cpp-httplib 0.11 (Debian 12) parses requests
// well but bounds neither the number of header lines nor the time they take:
// one client could send headers until the server runs out of memory, or
// trickle them to hold a thread forever. ConnectionStream is the httplib
// Stream of one connection (plain or TLS) with that guard: a request's line
// and headers may take at most `max_header_bytes` and arrive within
// `header_timeout`; past either the client gets 431 or 408 and the
// connection is closed. Reads and writes each wait at most `io_timeout`.
//
// GuardedServer<httplib::Server> and GuardedServer<httplib::SSLServer> run
// httplib's own request handling (process_request) on that stream, one
// connection per pool thread, keep-alive until idle for `io_timeout`.
//
// A ConnectionStream belongs to the one thread serving its connection; the
// servers are used as httplib's.
#ifndef NORMD_SERVER_HTTP_CONNECTION_H_
#define NORMD_SERVER_HTTP_CONNECTION_H_

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>

namespace normd {

struct ConnectionLimits {
  size_t max_header_bytes = 64 << 10;
  std::chrono::milliseconds header_timeout{5000};
  std::chrono::milliseconds io_timeout{5000};
  // DrainBeforeClose's limit in all.
  std::chrono::milliseconds linger_timeout{30000};
};

class ConnectionStream final : public httplib::Stream {
 public:
  // `ssl` null: plain TCP. Neither is owned.
  ConnectionStream(socket_t sock, SSL* ssl, const ConnectionLimits& limits);

  // Waits up to `timeout` for the next request's first byte: false when the
  // client closed the connection or sent nothing.
  bool WaitForRequest(std::chrono::milliseconds timeout);
  // A new request starts: its header budget and deadline.
  void StartRequest();
  // 431 or 408 once the guard refused the current request (then every read
  // and write fails); 0 otherwise.
  int refused() const { return refused_; }
  // Writes the refusal's response directly (the stream refuses writes).
  void SendRefusal();
  // Before closing a connection whose request was answered unread (see
  // CloseConnectionAfterResponse): half-closes it and discards what the
  // client still sends until it closes, sends nothing for `io_timeout`, or
  // `linger_timeout` has passed, so that a client still sending its body
  // reads the answer rather than a reset.
  void DrainBeforeClose();

  bool is_readable() const override;
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return sock_; }

 private:
  // Reads more bytes into the buffer: how many; 0 when the client closed,
  // -1 on an error or timeout (or once the guard refused the request).
  ssize_t Fill();
  ssize_t Send(const char* ptr, size_t size);
  // Counts delivered header bytes and finds the blank line ending them.
  void Deliver(const char* ptr, size_t size);

  const socket_t sock_;
  SSL* const ssl_;
  const ConnectionLimits limits_;
  std::string buffer_;
  size_t begin_ = 0;  // Unread bytes: buffer_[begin_, buffer_.size()).
  bool in_headers_ = false;
  size_t header_bytes_ = 0;
  int terminator_ = 0;  // How much of "\r\n\r\n" the last bytes matched.
  std::chrono::steady_clock::time_point header_deadline_;
  int refused_ = 0;
};

// httplib's server (Base: httplib::Server or httplib::SSLServer) serving
// each connection through a ConnectionStream. `on_refused(status)` is called
// for each request the guard refused.
template <typename Base>
class GuardedServer final : public Base {
 public:
  template <typename... Args>
  GuardedServer(ConnectionLimits limits, std::function<void(int)> on_refused,
                Args&&... args)
      : Base(std::forward<Args>(args)...),
        limits_(limits),
        on_refused_(std::move(on_refused)) {}

 private:
  bool process_and_close_socket(socket_t sock) override;
  // Requests on `stream` until the client or the server is done.
  void Serve(ConnectionStream& stream);

  const ConnectionLimits limits_;
  const std::function<void(int)> on_refused_;
};

// Whether the guard refused the request this thread is answering (so that
// httplib's own answer to the cut-off request is not counted besides the
// refusal).
bool RequestRefusedOnThisThread();

// For a handler that answers before it has read the request's whole body
// (a body past the limit): the connection serving this thread's request is
// closed once the response is written, instead of reading the rest of the
// body as the next request. No effect outside a GuardedServer.
void CloseConnectionAfterResponse();

using GuardedHttpServer = GuardedServer<httplib::Server>;
using GuardedHttpsServer = GuardedServer<httplib::SSLServer>;

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_CONNECTION_H_

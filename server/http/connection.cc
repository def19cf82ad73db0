#include "server/http/connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "server/http/rest_codec.h"

namespace normd {
namespace {

constexpr size_t kReadChunk = 16 << 10;

thread_local bool request_refused = false;
thread_local bool close_after_response = false;

void SetTimeouts(socket_t sock, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
  setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

bool Poll(socket_t sock, short events, std::chrono::milliseconds timeout) {
  pollfd pfd{sock, events, 0};
  return ::poll(&pfd, 1, static_cast<int>(timeout.count())) > 0 &&
         (pfd.revents & (events | POLLHUP | POLLERR)) != 0;
}

void IpAndPort(const sockaddr_storage& address, socklen_t length,
               std::string& ip, int& port) {
  char host[NI_MAXHOST];
  char service[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&address), length, host,
                  sizeof(host), service, sizeof(service),
                  NI_NUMERICHOST | NI_NUMERICSERV) == 0) {
    ip = host;
    port = std::atoi(service);
  }
}

}  // namespace

bool RequestRefusedOnThisThread() { return request_refused; }

void CloseConnectionAfterResponse() { close_after_response = true; }

ConnectionStream::ConnectionStream(socket_t sock, SSL* ssl,
                                   const ConnectionLimits& limits)
    : sock_(sock), ssl_(ssl), limits_(limits) {
  SetTimeouts(sock_, limits_.io_timeout);
}

bool ConnectionStream::WaitForRequest(std::chrono::milliseconds timeout) {
  if (begin_ < buffer_.size()) return true;
  if (ssl_ != nullptr && SSL_pending(ssl_) > 0) return Fill() > 0;
  return Poll(sock_, POLLIN, timeout) && Fill() > 0;
}

void ConnectionStream::StartRequest() {
  request_refused = false;
  close_after_response = false;
  in_headers_ = true;
  header_bytes_ = 0;
  terminator_ = 0;
  header_deadline_ = std::chrono::steady_clock::now() + limits_.header_timeout;
}

ssize_t ConnectionStream::Fill() {
  if (begin_ == buffer_.size()) {
    buffer_.clear();
    begin_ = 0;
  }
  const size_t old_size = buffer_.size();
  buffer_.resize(old_size + kReadChunk);
  char* at = buffer_.data() + old_size;
  const ssize_t n = ssl_ != nullptr
                        ? static_cast<ssize_t>(
                              SSL_read(ssl_, at, static_cast<int>(kReadChunk)))
                        : ::recv(sock_, at, kReadChunk, 0);
  buffer_.resize(old_size + static_cast<size_t>(std::max<ssize_t>(n, 0)));
  if (in_headers_ && std::chrono::steady_clock::now() > header_deadline_) {
    refused_ = 408;
    request_refused = true;
    return -1;
  }
  return n;
}

void ConnectionStream::Deliver(const char* ptr, size_t size) {
  if (!in_headers_) return;
  for (size_t i = 0; i < size; ++i) {
    ++header_bytes_;
    const char want = terminator_ % 2 == 0 ? '\r' : '\n';
    terminator_ = ptr[i] == want ? terminator_ + 1 : (ptr[i] == '\r' ? 1 : 0);
    if (terminator_ == 4) {
      in_headers_ = false;
      return;
    }
  }
  if (header_bytes_ > limits_.max_header_bytes) {
    refused_ = 431;
    request_refused = true;
  }
}

bool ConnectionStream::is_readable() const {
  return refused_ == 0 && (begin_ < buffer_.size() ||
                           (ssl_ != nullptr && SSL_pending(ssl_) > 0) ||
                           Poll(sock_, POLLIN, limits_.io_timeout));
}

bool ConnectionStream::is_writable() const {
  return refused_ == 0 && Poll(sock_, POLLOUT, limits_.io_timeout);
}

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  if (refused_ != 0) return -1;
  if (begin_ == buffer_.size()) {
    const ssize_t filled = Fill();
    if (filled <= 0) return refused_ != 0 ? -1 : filled;  // 0: closed.
  }
  const size_t n = std::min(size, buffer_.size() - begin_);
  std::memcpy(ptr, buffer_.data() + begin_, n);
  begin_ += n;
  Deliver(ptr, n);
  return refused_ != 0 ? -1 : static_cast<ssize_t>(n);
}

ssize_t ConnectionStream::Send(const char* ptr, size_t size) {
  if (ssl_ != nullptr) {
    const int n =
        SSL_write(ssl_, ptr, static_cast<int>(std::min<size_t>(size, 1 << 30)));
    return n > 0 ? n : -1;
  }
  return ::send(sock_, ptr, size, MSG_NOSIGNAL);
}

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  return refused_ != 0 ? -1 : Send(ptr, size);
}

void ConnectionStream::SendRefusal() {
  const bool too_large = refused_ == 431;
  const std::string body = ErrorJson(
      too_large
          ? absl::StrCat("headers: the request line and headers are larger "
                         "than ",
                         limits_.max_header_bytes,
                         " bytes (--http_max_header_bytes)")
          : absl::StrCat("headers: the request line and headers did not "
                         "arrive within ",
                         limits_.header_timeout.count(),
                         " ms (--http_idle_timeout)"));
  const std::string response = absl::StrCat(
      "HTTP/1.1 ",
      too_large ? "431 Request Header Fields Too Large" : "408 Request Timeout",
      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
      "\r\nConnection: close\r\n\r\n", body);
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = Send(response.data() + sent, response.size() - sent);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
}

void ConnectionStream::DrainBeforeClose() {
  ::shutdown(sock_, SHUT_WR);
  const auto deadline =
      std::chrono::steady_clock::now() + limits_.linger_timeout;
  char discarded[kReadChunk];
  for (auto now = std::chrono::steady_clock::now(); now < deadline;
       now = std::chrono::steady_clock::now()) {
    const auto left = std::min(
        limits_.io_timeout,
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
    if (!Poll(sock_, POLLIN, left) ||
        ::recv(sock_, discarded, sizeof(discarded), 0) <= 0) {
      return;
    }
  }
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip,
                                              int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    IpAndPort(address, length, ip, port);
  }
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getsockname(sock_, reinterpret_cast<sockaddr*>(&address), &length) == 0) {
    IpAndPort(address, length, ip, port);
  }
}

template <typename Base>
bool GuardedServer<Base>::process_and_close_socket(socket_t sock) {
  SSL* ssl = nullptr;
  bool accepted = true;
  if constexpr (std::is_same_v<Base, httplib::SSLServer>) {
    // The handshake under the same timeouts as every read and write.
    SetTimeouts(sock, limits_.io_timeout);
    ssl = SSL_new(this->ssl_context());
    accepted =
        ssl != nullptr && SSL_set_fd(ssl, sock) == 1 && SSL_accept(ssl) == 1;
  }
  if (accepted) {
    ConnectionStream stream(sock, ssl, limits_);
    Serve(stream);
    if (ssl != nullptr) SSL_shutdown(ssl);
  }
  if (ssl != nullptr) SSL_free(ssl);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  return accepted;
}

template <typename Base>
void GuardedServer<Base>::Serve(ConnectionStream& stream) {
  // Until the server stops (its listening socket closed), the client closes
  // or idles, asks to close, or a request cannot be read.
  while (this->svr_sock_ != INVALID_SOCKET &&
         stream.WaitForRequest(limits_.io_timeout)) {
    stream.StartRequest();
    bool closed = false;
    const bool answered = this->process_request(stream, false, closed, nullptr);
    if (stream.refused() != 0) {
      stream.SendRefusal();
      on_refused_(stream.refused());
      return;
    }
    if (close_after_response) {
      stream.DrainBeforeClose();
      return;
    }
    if (!answered || closed) return;
  }
}

template class GuardedServer<httplib::Server>;
template class GuardedServer<httplib::SSLServer>;

}  // namespace normd

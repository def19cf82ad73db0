// libFuzzer target over the REST front end's connection handling as a
// client meets it: a real HttpServer (Beast on Asio, with its deadlines
// short so that iterations stay fast) on a loopback port, a bearer token
// configured, and one TCP connection per input. The input's first byte says
// how the client behaves; the rest is what it sends:
//   bits 0-1: 0 keeps the client's side open after sending, so that only
//             the server's deadlines (idle, header, body, linger) can end
//             the connection; otherwise the client half-closes after it;
//   bits 2-4: k, sending in pieces of 4^k bytes (1 byte to 16 KiB), so that
//             requests split across reads anywhere;
//   bit 5:    a 5 ms pause between pieces (at most 8), past the header and
//             body deadlines.
// Invariants, beyond no crash or sanitizer report:
//   - the server ends every connection within its deadlines: it never holds
//     one, and its open-connections gauge returns to zero;
//   - what it sends is well-formed HTTP/1.1: one answer per request the
//     input holds, in order, and at most one more refusing what could not
//     be read; never a 500, and every error has a JSON body naming what is
//     wrong (rest_fixture.h);
//   - a request with the token is never answered 401, and a request without
//     it never succeeds, but for the health probes;
//   - when no answer is a success, no model changed.
// rest_fuzzer drives the same RestApi request by request, without a socket.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/http/http_metrics.h"
#include "server/http/http_server.h"
#include "server/http/request_framing.h"
#include "server/http/rest_router.h"
#include "tests/fuzz/rest_fixture.h"

namespace {

namespace http = boost::beast::http;
using Clock = std::chrono::steady_clock;
using normd::fuzzing::FailAnswer;

constexpr int64_t kMaxHeaderBytes = 2048;
// Far past every deadline the server is given below, and the time to
// compute an answer to 8 KiB of input under the sanitizers.
constexpr auto kHeldTooLong = std::chrono::seconds(10);

[[noreturn]] void Fail(const char* what) {
  fprintf(stderr, "%s\n", what);
  abort();
}

struct Server {
  Server() {
    normd::HttpServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    options.io_threads = 1;
    options.max_header_bytes = kMaxHeaderBytes;
    options.header_timeout = absl::Milliseconds(20);
    options.idle_timeout = absl::Milliseconds(20);
    options.body_timeout = absl::Milliseconds(40);
    options.linger_timeout = absl::Milliseconds(20);
    auto started = normd::HttpServer::Start(options, fixture.api, metrics);
    if (!started.ok()) Fail("the HTTP server did not start");
    server = *std::move(started);
  }
  double OpenConnections() {
    for (const auto& family : fixture.stack.registry.Collect()) {
      if (family.name == "normd_http_connections") {
        return family.metric.at(0).gauge.value;
      }
    }
    Fail("no normd_http_connections gauge");
  }

  normd::fuzzing::RestFixture fixture;
  normd::HttpMetrics metrics{fixture.stack.registry};
  std::unique_ptr<normd::HttpServer> server;
};

// What the server must make of one request the input holds, as Beast
// reads it with the server's limits.
struct SentRequest {
  bool head_only = false;
  bool with_token = false;
  bool probe = false;
};

// The requests `bytes` holds in order, up to the first that cannot be read
// whole (whose answer, if any, is a refusal).
struct SentRequests {
  std::vector<SentRequest> whole;
  // Whether the first that cannot be read whole is a HEAD request (its
  // refusal then has no body).
  bool refused_head_only = false;
};

SentRequests RequestsIn(absl::string_view bytes) {
  SentRequests sent;
  boost::beast::flat_buffer buffer = normd::fuzzing::BufferOf(bytes);
  while (buffer.size() > 0) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(kMaxHeaderBytes);
    parser.body_limit(normd::fuzzing::kRestMaxBody);
    while (buffer.size() > 0 && !parser.is_done()) {
      boost::beast::error_code ec;
      const size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec || used == 0) break;
    }
    if (!parser.is_header_done() ||
        normd::CheckFraming(parser.get().base()).has_value()) {
      break;
    }
    const normd::RestRequestHead head = normd::HeadOf(parser);
    SentRequest request;
    request.head_only = head.method == "HEAD";
    if (!parser.is_done()) {
      sent.refused_head_only = request.head_only;
      break;
    }
    request.with_token = normd::fuzzing::CarriesToken(head);
    const auto route = normd::RouteRestRequest(head.method, head.target);
    request.probe = route.ok() && normd::IsHealthProbe(route->endpoint);
    sent.whole.push_back(request);
    if (!parser.keep_alive()) break;
  }
  return sent;
}

// What the client got back: every byte until the server closed.
struct Received {
  std::string bytes;
  bool reset = false;  // Closed with a reset: the last answers may be lost.
};

// Sends `bytes` as `first` says (see the top of the file) and reads until
// the server closes the connection.
Received Exchange(int port, uint8_t first, absl::string_view bytes,
                  double (*open_connections)()) {
  const bool half_close = (first & 3) != 0;
  const size_t piece = size_t{1} << (2 * ((first >> 2) & 7));
  const bool pause = (first & 0x20) != 0;
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) Fail("socket");
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
          0 &&
      errno != EINPROGRESS) {
    Fail("connect");
  }
  Received received;
  size_t sent = 0;
  int pauses = 0;
  bool write_open = true;
  Clock::time_point next_send = Clock::now();
  const Clock::time_point give_up = Clock::now() + kHeldTooLong;
  char chunk[16 << 10];
  for (;;) {
    const Clock::time_point now = Clock::now();
    if (now > give_up) {
      // What tells a held connection from one never accepted or a stalled
      // computation.
      fprintf(stderr,
              "sent %zu of %zu bytes (client side %s), received %zu, "
              "connections open %.0f\n",
              sent, bytes.size(), write_open ? "open" : "closed",
              received.bytes.size(), open_connections());
      Fail("the server held a connection past its deadlines");
    }
    if (write_open && sent == bytes.size() && half_close) {
      shutdown(fd, SHUT_WR);
      write_open = false;
    }
    const bool want_send = write_open && sent < bytes.size();
    pollfd p{fd,
             static_cast<short>(POLLIN |
                                (want_send && now >= next_send ? POLLOUT : 0)),
             0};
    const int wait_ms =
        want_send && now < next_send
            ? static_cast<int>(
                  std::chrono::ceil<std::chrono::milliseconds>(next_send - now)
                      .count())
            : 100;
    if (poll(&p, 1, wait_ms) < 0 && errno != EINTR) Fail("poll");
    if (p.revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
      if (n > 0) {
        received.bytes.append(chunk, static_cast<size_t>(n));
        continue;
      }
      if (n == 0) break;
      if (errno == ECONNRESET || errno == EPIPE) {
        received.reset = true;
        break;
      }
      if (errno != EAGAIN && errno != EINTR) Fail("recv");
    }
    if ((p.revents & POLLOUT) && want_send) {
      const size_t length = std::min(piece, bytes.size() - sent);
      const ssize_t n = send(fd, bytes.data() + sent, length, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
        if (pause && pauses < 8 && sent < bytes.size()) {
          ++pauses;
          next_send = Clock::now() + std::chrono::milliseconds(5);
        }
      } else if (errno == EPIPE || errno == ECONNRESET) {
        write_open = false;  // The server closed; read what it said.
      } else if (errno != EAGAIN && errno != EINTR) {
        Fail("send");
      }
    }
  }
  close(fd);
  return received;
}

// Reads the answers in `received` in turn and checks each against the
// request it answers. Returns whether one succeeded.
bool CheckAnswers(const Received& received, const SentRequests& sent) {
  const std::vector<SentRequest>& requests = sent.whole;
  boost::beast::flat_buffer buffer = normd::fuzzing::BufferOf(received.bytes);
  bool succeeded = false;
  size_t answered = 0;
  while (buffer.size() > 0) {
    if (answered > requests.size()) {
      Fail("an answer after the refusal that ends a connection");
    }
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::numeric_limits<uint64_t>::max());
    const bool head_only = answered < requests.size()
                               ? requests[answered].head_only
                               : sent.refused_head_only;
    parser.skip(head_only);
    while (buffer.size() > 0 && !parser.is_done()) {
      boost::beast::error_code ec;
      const size_t used = parser.put(buffer.data(), ec);
      buffer.consume(used);
      if (ec == http::error::need_more) break;
      if (ec) {
        fprintf(stderr, "%s\n", ec.message().c_str());
        Fail("an answer that is not HTTP/1.1");
      }
      if (used == 0) break;
    }
    if (!parser.is_done()) {
      if (received.reset) break;  // Cut by the reset.
      Fail("an answer cut short");
    }
    const auto& response = parser.get();
    const int status = static_cast<int>(response.result_int());
    if (status == 100) continue;  // Expect: 100-continue.
    if (response.version() != 11) Fail("an answer that is not HTTP/1.1");
    if (answered == requests.size()) {
      // The refusal of what could not be read.
      if (status < 400) FailAnswer("unreadable, yet answered", status, "");
    } else {
      const SentRequest& request = requests[answered];
      if (request.with_token && status == 401) {
        FailAnswer("401 for a request with the token", status, response.body());
      }
      if (!request.with_token && !request.probe && status < 300) {
        FailAnswer("a request without the token succeeded", status,
                   response.body());
      }
    }
    if (!head_only) normd::fuzzing::CheckRestAnswer(status, response.body());
    succeeded = succeeded || status < 300;
    ++answered;
  }
  return succeeded;
}

Server& Instance() {
  static Server* server = new Server;
  return *server;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Server* const server = &Instance();
  if (size < 2) return 0;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 1,
                                size - 1);
  const uint64_t before = server->fixture.Fingerprint();
  const Received received =
      Exchange(server->server->port(), data[0], bytes,
               [] { return Instance().OpenConnections(); });
  const bool succeeded = CheckAnswers(received, RequestsIn(bytes));
  if (!succeeded && !received.reset &&
      server->fixture.Fingerprint() != before) {
    Fail("no answer succeeded, yet a model changed");
  }
  // The connection is the server's to close: its gauge drops once the last
  // handler has let go of it.
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(2);
  while (server->OpenConnections() != 0) {
    if (Clock::now() > give_up) Fail("a closed connection is still open");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  server->fixture.Trim();
  return 0;
}

#include "server/http/http_connection.h"

#include <algorithm>
#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/core/parallel.h"
#include "server/http/infer_body.h"
#include "server/http/reply_body.h"
#include "server/http/request_framing.h"
#include "server/http/rest_json.h"
#include "server/http/rest_router.h"

namespace normd {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

tcp::socket& Socket(tcp::socket& stream) { return stream; }
tcp::socket& Socket(asio::ssl::stream<tcp::socket>& stream) {
  return stream.next_layer();
}

std::string Seconds(absl::Duration d) { return absl::FormatDuration(d); }

// Where a connection is.
enum class Phase {
  kHandshake,  // TLS.
  kIdle,       // Waiting for a request's first byte.
  kHeader,     // Reading a request's line and headers.
  kBody,       // Reading its body.
  kComputing,  // Its answer is computed off the I/O threads.
  kWriting,    // Writing the answer.
  kLingering,  // Discarding what the client still sends before closing.
  kClosed,
};

template <typename Stream>
class Connection final
    : public ConnectionHandle,
      public std::enable_shared_from_this<Connection<Stream>> {
 public:
  Connection(ConnectionHub& hub, Stream stream)
      : hub_(hub),
        stream_(std::move(stream)),
        timer_(stream_.get_executor()),
        buffer_(static_cast<size_t>(hub.options.max_header_bytes) +
                (64 << 10)) {}
  ~Connection() override { hub_.Unregister(this); }

  void Start() {
    if constexpr (std::is_same_v<Stream, tcp::socket>) {
      WaitForRequest();
    } else {
      Handshake();
    }
  }

  void Stop(Clock::time_point deadline) override {
    asio::post(stream_.get_executor(), [self = this->shared_from_this(),
                                        deadline] { self->OnStop(deadline); });
  }

 private:
  const HttpServerOptions& options() const { return hub_.options; }

  // Cancels the pending read or write at `when` (or at the server's cut,
  // if earlier); `timed_out_` tells its handler why it was cancelled. The
  // timer is re-armed only when the deadline comes earlier than it is set
  // for: a later one is found when it fires, so that the common case (each
  // request's deadlines later than the last's) costs no timer operation.
  void SetDeadline(Clock::time_point when) {
    deadline_ = std::min(when, cut_at_);
    timed_out_ = false;
    if (!timer_armed_ || armed_at_ > deadline_) ArmTimer(deadline_);
  }
  // Nothing is pending: the timer, when it fires, finds no deadline.
  void CancelDeadline() { deadline_ = Clock::time_point::max(); }
  void ArmTimer(Clock::time_point at) {
    armed_at_ = at;
    timer_armed_ = true;
    const uint64_t generation = ++timer_generation_;
    timer_.expires_at(at);
    timer_.async_wait([self = this->shared_from_this(),
                       generation](const beast::error_code& ec) {
      if (generation != self->timer_generation_) return;  // Re-armed since.
      self->timer_armed_ = false;
      if (ec || self->deadline_ == Clock::time_point::max()) return;
      if (Clock::now() < self->deadline_) {
        self->ArmTimer(self->deadline_);  // The deadline moved later.
        return;
      }
      self->timed_out_ = true;
      beast::error_code ignored;
      Socket(self->stream_).cancel(ignored);
    });
  }
  // Whether the server's cut (shutdown) ended the pending operation.
  bool CutByStop() const {
    return timed_out_ && stopping_ && Clock::now() >= cut_at_;
  }

  void Handshake() {
    phase_ = Phase::kHandshake;
    SetDeadline(Clock::now() +
                absl::ToChronoNanoseconds(options().header_timeout));
    if constexpr (!std::is_same_v<Stream, tcp::socket>) {
      stream_.async_handshake(
          asio::ssl::stream_base::server,
          [self = this->shared_from_this()](const beast::error_code& ec) {
            self->CancelDeadline();
            if (ec) return self->Close();
            self->WaitForRequest();
          });
    }
  }

  void WaitForRequest() {
    phase_ = Phase::kIdle;
    exchange_ = RestExchange();
    parser_.reset();
    response_.reset();
    body_.reset();
    if (stopping_) return Close();
    if (buffer_.size() > 0) return ReadHeader();  // Pipelined.
    SetDeadline(Clock::now() +
                absl::ToChronoNanoseconds(options().idle_timeout));
    stream_.async_read_some(buffer_.prepare(16 << 10),
                            [self = this->shared_from_this()](
                                const beast::error_code& ec, size_t bytes) {
                              self->CancelDeadline();
                              // Idle past the timeout, closed, or stopped:
                              // closed in silence.
                              if (ec) return self->Close();
                              self->buffer_.commit(bytes);
                              self->ReadHeader();
                            });
  }

  void ReadHeader() {
    phase_ = Phase::kHeader;
    request_start_ = Clock::now();
    has_body_ = false;
    head_only_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(options().max_header_bytes));
    // The body's limit is decided after the token and admission.
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    SetDeadline(request_start_ +
                absl::ToChronoNanoseconds(options().header_timeout));
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](const beast::error_code& ec, size_t) {
          self->OnHeader(ec);
        });
  }

  void OnHeader(const beast::error_code& ec) {
    CancelDeadline();
    if (ec) {
      if (CutByStop()) return Close();
      if (timed_out_) {
        return Refuse(408, absl::StrCat("headers: not complete within ",
                                        Seconds(options().header_timeout),
                                        " of the request's first byte "
                                        "(--http_header_timeout)"));
      }
      if (ec == http::error::end_of_stream || ec == asio::error::eof ||
          ec == asio::error::connection_reset) {
        return Close();
      }
      const FramingRefusal refusal = RefusalOfParseError(ec);
      return Refuse(refusal.status, refusal.message);
    }
    const http::request_header<>& head = parser_->get().base();
    if (std::optional<FramingRefusal> refusal = CheckFraming(head)) {
      return Refuse(refusal->status, refusal->message);
    }
    exchange_.head = HeadOf(*parser_);
    has_body_ = !parser_->is_done();
    head_only_ = head.method() == http::verb::head;
    if (std::optional<RestResponse> early = hub_.api.Admit(exchange_)) {
      return Answer(*std::move(early));
    }
    if (!has_body_) return Compute();
    parser_->body_limit(static_cast<uint64_t>(hub_.api.max_body_bytes()));
    const auto expect = head.find(http::field::expect);
    if (expect != head.end() &&
        beast::iequals(expect->value(), "100-continue")) {
      return SendContinue();
    }
    ReadBody();
  }

  void SendContinue() {
    continue_.emplace(http::status::continue_, 11);
    SetDeadline(Clock::now() +
                absl::ToChronoNanoseconds(options().body_timeout));
    http::async_write(
        stream_, *continue_,
        [self = this->shared_from_this()](const beast::error_code& ec, size_t) {
          self->CancelDeadline();
          if (ec) return self->Close();
          self->ReadBody();
        });
  }

  void ReadBody() {
    phase_ = Phase::kBody;
    body_start_ = Clock::now();
    body_deadline_ =
        body_start_ + absl::ToChronoNanoseconds(options().body_timeout);
    received_ = 0;
    if (!exchange_.head.content_length.has_value()) return ReadMoreBody();
    // A body of known length goes straight from the socket into a pooled
    // buffer (not through the parser's copy), with room for the JSON
    // parser's padding, and placed so that binary data after a JSON head
    // starts 64-byte aligned: the kernels then read it in place.
    const size_t length = static_cast<size_t>(*exchange_.head.content_length);
    uint64_t json = 0;
    if (!exchange_.head.header_length.has_value() ||
        !absl::SimpleAtoi(*exchange_.head.header_length, &json) ||
        json > length) {
      json = 0;
    }
    body_offset_ = (64 - json % 64) % 64;
    body_length_ = length;
    body_readable_ = length + JsonPadding();
    body_ = AcquirePooled(body_offset_ + body_readable_);
    char* const start = static_cast<char*>(body_.get()) + body_offset_;
    // What arrived with the headers.
    const size_t buffered = std::min(buffer_.size(), length);
    asio::buffer_copy(asio::buffer(start, buffered), buffer_.data());
    buffer_.consume(buffered);
    body_read_ = buffered;
    ReadMoreDirect();
  }

  void ReadMoreDirect() {
    if (body_read_ == body_length_) return Compute();
    SetDeadline(std::min(body_deadline_, RateDeadline(body_start_, received_)));
    char* const start = static_cast<char*>(body_.get()) + body_offset_;
    stream_.async_read_some(
        asio::buffer(start + body_read_, body_length_ - body_read_),
        [self = this->shared_from_this()](const beast::error_code& ec,
                                          size_t bytes) {
          self->CancelDeadline();
          self->received_ += static_cast<int64_t>(bytes);
          self->body_read_ += bytes;
          if (ec) return self->BodyFailed(ec);
          self->ReadMoreDirect();
        });
  }

  // When the average rate since `start` falls below the minimum if nothing
  // more arrives (never before `grace` has passed).
  Clock::time_point RateDeadline(
      Clock::time_point start, int64_t received,
      absl::Duration grace = absl::Seconds(1)) const {
    if (options().min_body_rate <= 0) return Clock::time_point::max();
    const double seconds =
        std::max(absl::ToDoubleSeconds(grace),
                 static_cast<double>(received) /
                     static_cast<double>(options().min_body_rate));
    return start + std::chrono::duration_cast<Clock::duration>(
                       std::chrono::duration<double>(seconds));
  }

  void ReadMoreBody() {
    SetDeadline(std::min(body_deadline_, RateDeadline(body_start_, received_)));
    http::async_read_some(stream_, buffer_, *parser_,
                          [self = this->shared_from_this()](
                              const beast::error_code& ec, size_t bytes) {
                            self->OnBodyRead(ec, bytes);
                          });
  }

  void OnBodyRead(const beast::error_code& ec, size_t bytes) {
    CancelDeadline();
    received_ += static_cast<int64_t>(bytes);
    if (ec) return BodyFailed(ec);
    if (std::optional<RestResponse> refused = hub_.api.AdmitReceived(
            exchange_, static_cast<int64_t>(parser_->get().body().size()))) {
      return Answer(*std::move(refused));
    }
    if (parser_->is_done()) return Compute();
    ReadMoreBody();
  }

  // Reading the body failed with `ec`: a deadline (408), the client gone,
  // a malformed or oversized chunked body.
  void BodyFailed(const beast::error_code& ec) {
    if (CutByStop()) return Close();
    if (timed_out_) {
      const bool whole = Clock::now() >= body_deadline_;
      const double elapsed =
          std::chrono::duration<double>(Clock::now() - body_start_).count();
      return RefuseCall(
          absl::CancelledError(
              whole ? absl::StrCat("body: not complete within ",
                                   Seconds(options().body_timeout),
                                   " of the headers (--http_body_timeout)")
                    : absl::StrCat("body: ", received_, " bytes in ",
                                   static_cast<int64_t>(elapsed * 1000),
                                   " ms, slower than the server's minimum of ",
                                   options().min_body_rate,
                                   " bytes per second (--http_min_body_rate)")),
          408);
    }
    if (ec == http::error::end_of_stream || ec == asio::error::eof ||
        ec == asio::error::connection_reset ||
        ec == http::error::partial_message) {
      return Close();
    }
    const FramingRefusal refusal = RefusalOfParseError(ec);
    RefuseCall(refusal.status == 413
                   ? absl::ResourceExhaustedError(refusal.message)
                   : absl::InvalidArgumentError(refusal.message),
               refusal.status);
  }

  void Compute() {
    phase_ = Phase::kComputing;
    has_body_ = false;  // Read whole.
    hub_.ComputationStarted();
    RestApi::Body body;
    if (body_ != nullptr) {
      body.bytes = absl::string_view(
          static_cast<const char*>(body_.get()) + body_offset_, body_length_);
      body.readable = body_readable_;
    } else {
      std::string& text = parser_->get().body();
      body.bytes = text;
      body.readable = text.capacity();
    }
    auto handle = [self = this->shared_from_this(), body] {
      self->hub_.api.Handle(
          self->exchange_, body, [self](RestResponse response) {
            asio::post(self->stream_.get_executor(),
                       [self, response = std::move(response)]() mutable {
                         self->Answer(std::move(response));
                       });
            self->hub_.ComputationEnded();
          });
    };
    // A health probe computes nothing and reads no body: answered from the
    // I/O thread, it never waits behind the requests queued for compute (a
    // liveness probe must not fail because the server is busy).
    if (IsHealthProbe(exchange_.route.endpoint)) return handle();
    EnqueueCompute(std::move(handle));
  }

  // An answer that ends the connection, to a request that reached no
  // service call (or whose call `RefuseCall` finishes).
  void Refuse(int status, const std::string& message) {
    RestResponse response = RestApi::ErrorResponse(status, message);
    response.close = true;
    Answer(std::move(response));
  }
  void RefuseCall(const absl::Status& status, int http_status) {
    if (exchange_.call != nullptr) exchange_.call->Finish(status.code());
    Refuse(http_status, std::string(status.message()));
  }

  void Answer(RestResponse answer) {
    phase_ = Phase::kWriting;
    hub_.metrics.Handled(
        exchange_.route.endpoint, answer.status,
        std::chrono::duration<double>(Clock::now() - request_start_).count());
    const bool keep_alive = !answer.close && !stopping_ && !has_body_ &&
                            parser_.has_value() && parser_->is_header_done() &&
                            parser_->get().keep_alive();
    close_after_write_ = !keep_alive;
    response_.emplace(static_cast<http::status>(answer.status), 11);
    http::response<ReplyBody>& r = *response_;
    r.set(http::field::server, "normd");
    r.set(http::field::content_type, answer.content_type);
    for (const auto& [name, value] : answer.headers) r.set(name, value);
    r.keep_alive(keep_alive);
    const size_t length = answer.body.size() + answer.payload_bytes;
    if (!head_only_) {
      r.body().json = std::move(answer.body);
      r.body().payload = std::move(answer.payload);
      r.body().payload_bytes = static_cast<size_t>(answer.payload_bytes);
    }
    r.content_length(length);
    SetDeadline(Clock::now() +
                absl::ToChronoNanoseconds(options().body_timeout));
    http::async_write(
        stream_, r,
        [self = this->shared_from_this()](const beast::error_code& ec, size_t) {
          self->OnWritten(ec);
        });
  }

  void OnWritten(const beast::error_code& ec) {
    CancelDeadline();
    if (ec) return Close();
    if (!close_after_write_) return WaitForRequest();
    // What is left of an unread body is not a next request: let the
    // client read the answer, then close.
    if (has_body_) return Linger();
    Close();
  }

  void Linger() {
    phase_ = Phase::kLingering;
    beast::error_code ignored;
    Socket(stream_).shutdown(tcp::socket::shutdown_send, ignored);
    linger_start_ = Clock::now();
    linger_deadline_ =
        linger_start_ + absl::ToChronoNanoseconds(options().linger_timeout);
    lingered_ = 0;
    DiscardMore();
  }

  void DiscardMore() {
    // The rate rule starts only after the idle timeout: a client that
    // pauses for a moment (a GC, a busy machine) before sending the rest
    // must still find its answer, not a reset; one that keeps trickling is
    // closed then.
    SetDeadline(std::min(
        linger_deadline_,
        RateDeadline(linger_start_, lingered_, options().idle_timeout)));
    Socket(stream_).async_read_some(
        asio::buffer(discard_), [self = this->shared_from_this()](
                                    const beast::error_code& ec, size_t bytes) {
          self->CancelDeadline();
          if (ec) return self->Close();
          self->lingered_ += static_cast<int64_t>(bytes);
          self->DiscardMore();
        });
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    CancelDeadline();
    timer_.cancel();  // Its wait holds the connection.
    beast::error_code ignored;
    Socket(stream_).shutdown(tcp::socket::shutdown_both, ignored);
    Socket(stream_).close(ignored);
  }

  void OnStop(Clock::time_point deadline) {
    stopping_ = true;
    cut_at_ = deadline;
    switch (phase_) {
      case Phase::kIdle:
      case Phase::kHandshake:
      case Phase::kLingering:
        return Close();
      case Phase::kHeader:
      case Phase::kBody:
      case Phase::kWriting:
        // Cut at the deadline unless done by then.
        if (deadline_ > cut_at_) SetDeadline(cut_at_);
        return;
      case Phase::kComputing:  // Answered, then closed.
      case Phase::kClosed:
        return;
    }
  }

  ConnectionHub& hub_;
  Stream stream_;
  asio::steady_timer timer_;
  uint64_t timer_generation_ = 0;
  bool timer_armed_ = false;
  Clock::time_point armed_at_;
  // When the pending operation is cancelled; max() when none is pending.
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timed_out_ = false;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::optional<http::response<http::empty_body>> continue_;
  std::optional<http::response<ReplyBody>> response_;
  RestExchange exchange_;
  Phase phase_ = Phase::kIdle;
  bool has_body_ = false;   // The request has a body not (yet) read.
  bool head_only_ = false;  // A HEAD request: headers only.
  bool close_after_write_ = false;
  Clock::time_point request_start_;
  Clock::time_point body_start_;
  Clock::time_point body_deadline_;
  int64_t received_ = 0;  // Body bytes (and chunk framing) so far.
  // A body of known length, read straight into this buffer: its bytes are
  // [body_offset_, body_offset_ + body_length_), the first body_read_ of
  // them in; body_readable_ bytes from its start may be read (padding).
  PooledBuffer body_{nullptr, &BufferPool::Release};
  size_t body_offset_ = 0;
  size_t body_length_ = 0;
  size_t body_read_ = 0;
  size_t body_readable_ = 0;
  Clock::time_point linger_start_;
  Clock::time_point linger_deadline_;
  int64_t lingered_ = 0;
  std::array<char, 16 << 10> discard_{};
  bool stopping_ = false;
  Clock::time_point cut_at_ = Clock::time_point::max();
};

// Answers a connection past --http_max_connections with 503 (plain HTTP;
// a TLS one is closed) and closes it.
void RefuseConnection(tcp::socket socket, bool tls) {
  if (tls) return;  // Closed as it goes.
  static const std::string* const kAnswer = [] {
    const std::string body = ErrorJson(
        "connections: the server holds its limit of open connections "
        "(--http_max_connections); retry with backoff");
    return new std::string(
        absl::StrCat("HTTP/1.1 503 Service Unavailable\r\nServer: normd\r\n"
                     "Content-Type: application/json\r\nConnection: close\r\n"
                     "Content-Length: ",
                     body.size(), "\r\n\r\n", body));
  }();
  auto shared = std::make_shared<tcp::socket>(std::move(socket));
  asio::async_write(*shared, asio::buffer(*kAnswer),
                    [shared](const beast::error_code&, size_t) {
                      beast::error_code ignored;
                      shared->shutdown(tcp::socket::shutdown_both, ignored);
                      shared->close(ignored);
                    });
}

}  // namespace

void ServeConnection(ConnectionHub& hub, tcp::socket socket,
                     asio::ssl::context* tls) {
  beast::error_code ignored;
  socket.set_option(tcp::no_delay(true), ignored);
  if (!hub.HasRoom()) {
    hub.metrics.ConnectionRefused();
    RefuseConnection(std::move(socket), tls != nullptr);
    return;
  }
  if (tls != nullptr) {
    auto connection =
        std::make_shared<Connection<asio::ssl::stream<tcp::socket>>>(
            hub, asio::ssl::stream<tcp::socket>(std::move(socket), *tls));
    if (hub.Register(connection)) connection->Start();
    return;
  }
  auto connection = std::make_shared<Connection<tcp::socket>>(
      hub, tcp::socket(std::move(socket)));
  if (hub.Register(connection)) connection->Start();
}

}  // namespace normd

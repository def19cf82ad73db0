// The REST server's threads, in process: a real HttpServer on a loopback
// port in front of the service, with every compute thread held busy. The
// health probes are answered by the I/O thread regardless; every other
// endpoint waits its turn in the compute arena (checked, so that the test
// shows the arena really was busy).
#include "server/http/http_server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/core/parallel.h"
#include "server/http/http_metrics.h"
#include "server/http/rest_api.h"
#include "tests/testing/service_stack.h"

namespace normd {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

struct Reply {
  int status = 0;  // 0: no answer within the time given.
  std::string body;
};

// One GET on a fresh connection, answered within `within` or not at all
// (the stream's deadline applies to its asynchronous operations).
Reply Get(int port, const std::string& target, std::chrono::seconds within) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  http::request<http::empty_body> request(http::verb::get, target, 11);
  request.set(http::field::host, "normd");
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  Reply reply;
  stream.expires_after(within);
  stream.async_connect(
      asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port),
      [&](beast::error_code ec) {
        if (ec) return;
        http::async_write(stream, request, [&](beast::error_code ec, size_t) {
          if (ec) return;
          http::async_read(stream, buffer, response,
                           [&](beast::error_code ec, size_t) {
                             if (ec) return;
                             reply = {static_cast<int>(response.result_int()),
                                      response.body()};
                           });
        });
      });
  io.run();
  return reply;
}

// Occupies every thread of the compute arena until released (or
// destroyed). Its tasks share their state with it, so that a task the
// arena starts late finds it alive. Used from the test's thread.
class BusyComputeArena {
 public:
  BusyComputeArena() : threads_(ComputeConcurrency()) {
    for (int i = 0; i < threads_; ++i) {
      EnqueueCompute([state = state_] {
        state->started.fetch_add(1);
        state->release.WaitForNotification();
        state->finished.fetch_add(1);
      });
    }
  }
  // Gives the started tasks up to 10 s to end, so that the next test finds
  // the arena free.
  ~BusyComputeArena() {
    Release();
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (state_->finished.load() < state_->started.load() &&
           absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
  }

  // Whether every compute thread holds a task by `timeout`.
  bool EveryThreadHeld(absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (state_->started.load() < threads_) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return true;
  }
  void Release() {
    if (!state_->release.HasBeenNotified()) state_->release.Notify();
  }

 private:
  struct State {
    std::atomic<int> started{0};
    std::atomic<int> finished{0};
    absl::Notification release;
  };
  const int threads_;
  const std::shared_ptr<State> state_ = std::make_shared<State>();
};

class HttpServerThreadsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    HttpServerOptions options;
    options.bind_address = "127.0.0.1";
    options.port = 0;
    options.io_threads = 1;
    auto started = HttpServer::Start(options, api_, metrics_);
    ASSERT_TRUE(started.ok()) << started.status();
    server_ = *std::move(started);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Stop(absl::Now() + absl::Seconds(5));
  }

  // One compute thread, so that one task holds them all.
  ScopedComputeThreads compute_threads_{1};
  testing::ServiceStack stack_;
  RestApi api_{stack_.service, stack_.inference, RestLimits{}};
  prometheus::Registry registry_;
  HttpMetrics metrics_{registry_};
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerThreadsTest, HealthProbesAreAnsweredWhileComputeIsBusy) {
  const int port = server_->port();
  BusyComputeArena busy;
  ASSERT_TRUE(busy.EveryThreadHeld(absl::Seconds(10)));

  const Reply live = Get(port, "/v2/health/live", std::chrono::seconds(10));
  EXPECT_EQ(live.status, 200);
  EXPECT_NE(live.body.find("\"live\":true"), std::string::npos) << live.body;
  const Reply ready = Get(port, "/v2/health/ready", std::chrono::seconds(10));
  EXPECT_EQ(ready.status, 200);
  EXPECT_NE(ready.body.find("\"ready\":true"), std::string::npos) << ready.body;

  // The server's metadata is computed in the arena: it waits for a thread,
  // and is answered once one is free.
  auto metadata = std::async(std::launch::async, [port] {
    return Get(port, "/v2", std::chrono::seconds(30));
  });
  EXPECT_EQ(metadata.wait_for(std::chrono::milliseconds(300)),
            std::future_status::timeout)
      << "GET /v2 was answered while every compute thread was busy";
  busy.Release();
  const Reply answered = metadata.get();
  EXPECT_EQ(answered.status, 200);
  EXPECT_NE(answered.body.find("\"name\":\"normd\""), std::string::npos)
      << answered.body;
}

}  // namespace
}  // namespace normd

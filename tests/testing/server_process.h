// Runs a real normd binary as a child process on loopback for end-to-end
// tests: starts it with --port=0 --metrics_port=0, reads the chosen ports from
// its start-up log line, and stops it with a signal. Test-only; one thread
// owns a ServerProcess.
#ifndef NORMD_TESTS_TESTING_SERVER_PROCESS_H_
#define NORMD_TESTS_TESTING_SERVER_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <regex>
#include <string>
#include <vector>

namespace normd::testing {

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (log_fd_ >= 0) close(log_fd_);
  }

  // Starts `binary` with --bind_address=127.0.0.1 --port=0 --metrics_port=0
  // --http_port=0 plus `extra_args`; false (with the log in `log()`) if it did
  // not report its ports within 20 s.
  bool Start(const std::string& binary,
             const std::vector<std::string>& extra_args = {}) {
    int fds[2];
    if (pipe(fds) != 0) return false;
    std::vector<std::string> args = {binary, "--bind_address=127.0.0.1",
                                     "--port=0", "--metrics_port=0",
                                     "--http_port=0"};
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(binary.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    log_fd_ = fds[0];
    const std::regex ports(
        R"(serving gRPC on [^ ]*:(\d+), metrics on [^ ]*:(\d+))");
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      ReadLog(100);
      std::smatch m;
      if (std::regex_search(log_, m, ports)) {
        port_ = std::stoi(m[1]);
        metrics_port_ = std::stoi(m[2]);
        std::smatch rest;
        if (std::regex_search(log_, rest,
                              std::regex(R"(REST on [^ ]*:(\d+))"))) {
          http_port_ = std::stoi(rest[1]);
        }
        return true;
      }
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
    }
    return false;
  }

  // Sends `signal` and waits up to `timeout` for the exit; returns the exit
  // code (or -1 if it did not exit, or 128+signal if killed by one).
  int Stop(int signal = SIGTERM,
           std::chrono::seconds timeout = std::chrono::seconds(20)) {
    if (pid_ <= 0) return -1;
    kill(pid_, signal);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      ReadLog(50);
      int status;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ReadLog(0);
        if (WIFEXITED(status)) return WEXITSTATUS(status);
        return 128 + WTERMSIG(status);
      }
    }
    return -1;
  }

  // Sends a signal without waiting.
  void Signal(int signal) {
    if (pid_ > 0) kill(pid_, signal);
  }

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  int metrics_port() const { return metrics_port_; }
  int http_port() const { return http_port_; }  // 0: REST off.
  const std::string& log() {
    ReadLog(0);
    return log_;
  }

 private:
  void ReadLog(int timeout_ms) {
    pollfd pfd{log_fd_, POLLIN, 0};
    while (poll(&pfd, 1, timeout_ms) > 0 && (pfd.revents & POLLIN)) {
      char buffer[4096];
      const ssize_t n = read(log_fd_, buffer, sizeof(buffer));
      if (n <= 0) break;
      log_.append(buffer, static_cast<size_t>(n));
      timeout_ms = 0;
    }
  }

  pid_t pid_ = -1;
  int log_fd_ = -1;
  std::string log_;
  int port_ = 0;
  int metrics_port_ = 0;
  int http_port_ = 0;
};

// GET http://127.0.0.1:port/path over a plain socket (HTTP/1.0, as a
// load balancer's probe); the whole response, or "" on failure.
std::string HttpGetResponse(int port, const std::string& path);

// The body of HttpGetResponse, or "" on failure.
std::string HttpGet(int port, const std::string& path);

// One sample's value from Prometheus text: the first line that starts with
// `name{` (or `name `) and contains every one of `labels`; -1 if none.
double MetricValue(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels);

// The sum of the values of every such line (0 if none).
double MetricSum(const std::string& text, const std::string& name,
                 const std::vector<std::string>& labels);

}  // namespace normd::testing

#endif  // NORMD_TESTS_TESTING_SERVER_PROCESS_H_

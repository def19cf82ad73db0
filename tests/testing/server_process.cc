#include "tests/testing/server_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <sstream>
#include <string>
#include <vector>

namespace normd::testing {
namespace {

// Calls visit(value) for each line of Prometheus `text` that starts with
// `name{` (or `name `) and contains every one of `labels`, until it returns
// false.
template <typename Visit>
void ForEachSample(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels, Visit visit) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + "{", 0) != 0 && line.rfind(name + " ", 0) != 0) {
      continue;
    }
    bool all = true;
    for (const auto& label : labels) {
      all &= line.find(label) != std::string::npos;
    }
    if (all && !visit(std::stod(line.substr(line.rfind(' ') + 1)))) return;
  }
}

}  // namespace

double MetricValue(const std::string& text, const std::string& name,
                   const std::vector<std::string>& labels) {
  double value = -1;
  ForEachSample(text, name, labels, [&](double v) {
    value = v;
    return false;
  });
  return value;
}

double MetricSum(const std::string& text, const std::string& name,
                 const std::vector<std::string>& labels) {
  double sum = 0;
  ForEachSample(text, name, labels, [&](double v) {
    sum += v;
    return true;
  });
  return sum;
}

std::string HttpGetResponse(int port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET " + path +
                                " HTTP/1.0\r\nHost: 127.0.0.1\r\n"
                                "Connection: close\r\n\r\n";
    if (write(fd, request.data(), request.size()) ==
        static_cast<ssize_t>(request.size())) {
      char buffer[8192];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) {
        response.append(buffer, static_cast<size_t>(n));
      }
    }
  }
  close(fd);
  return response;
}

std::string HttpGet(int port, const std::string& path) {
  const std::string response = HttpGetResponse(port, path);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

}  // namespace normd::testing

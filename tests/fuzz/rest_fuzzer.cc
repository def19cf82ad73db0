// libFuzzer target over the REST front-end as a connection delivers it: the
// input is the bytes a client sends on one keep-alive connection (request
// lines, headers, bodies, chunked encoding, pipelined requests), read by
// cpp-httplib's request parser from an in-memory stream and answered by
// RestHandler: routing, the bearer token, the JSON parser, the binary-data
// extension, the OIP translation, the kernels and the model store. Any
// crash, sanitizer report or 500 answer is a bug (every bad input has a 4xx
// status naming what is wrong).
#include <httplib.h>
#include <prometheus/registry.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "google/protobuf/stubs/logging.h"
#include "server/core/engine.h"
#include "server/http/rest_handler.h"
#include "server/rpc/admission.h"
#include "server/rpc/health_service.h"
#include "server/rpc/metrics.h"
#include "server/rpc/normalizer_service.h"
#include "server/rpc/oip_service.h"
#include "tests/fuzz/service_fixture.h"

namespace {

// One connection's bytes in; whatever the server writes is kept.
class MemoryStream final : public httplib::Stream {
 public:
  MemoryStream(const uint8_t* data, size_t size)
      : data_(reinterpret_cast<const char*>(data)), size_(size) {}
  bool is_readable() const override { return true; }
  bool is_writable() const override { return true; }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, size_ - at_);
    std::memcpy(ptr, data_ + at_, n);
    at_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    written_.append(ptr, size);
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 40000;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = "127.0.0.1";
    port = 8000;
  }
  socket_t socket() const override { return 0; }
  bool exhausted() const { return at_ >= size_; }
  const std::string& written() const { return written_; }

 private:
  const char* const data_;
  const size_t size_;
  size_t at_ = 0;
  std::string written_;
};

// httplib's server with its per-connection request loop opened up.
class FuzzedServer final : public httplib::Server {
 public:
  bool Next(httplib::Stream& stream) {
    bool closed = false;
    return process_request(stream, false, closed, nullptr) && !closed;
  }
};

struct Fixture {
  Fixture() {
    handler.Install(server, 1 << 20);
    // BatchNorm models for the inputs to find: 4 channels and 1.
    for (const auto& [name, channels] :
         {std::pair<const char*, int>{"bn", 4}, {"bn1", 1}}) {
      normd::v1::CreateModelRequest create;
      create.set_name(name);
      create.set_num_features(channels);
      normd::v1::ModelState created;
      if (!service.DoCreateModel(create, created).ok()) abort();
    }
  }
  normd::fuzzing::ServiceFixture services;
  normd::NormalizerService& service = services.service;
  normd::HttpMetrics http_metrics{services.registry};
  normd::RestHandler handler{services.oip, service, http_metrics, ""};
  FuzzedServer server;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* fixture = new Fixture;
  MemoryStream stream(data, size);
  // Pipelined requests on one connection, as keep-alive delivers them.
  for (int request = 0; request < 8 && !stream.exhausted(); ++request) {
    if (!fixture->server.Next(stream)) break;
  }
  // Every response the server wrote, one after another: never a 500.
  const std::string& written = stream.written();
  size_t at = 0;
  while (at < written.size()) {
    const size_t head_end = written.find("\r\n\r\n", at);
    if (written.compare(at, 9, "HTTP/1.1 ") != 0 ||
        head_end == std::string::npos) {
      fprintf(stderr, "not an HTTP response at byte %zu\n", at);
      abort();
    }
    if (written.compare(at + 9, 3, "500") == 0) {
      fprintf(stderr, "a 500 answer:\n%s\n", written.substr(at, 600).c_str());
      abort();
    }
    // The body (its Content-Length), unless the response was to a HEAD,
    // which has the length but no body: then the next response follows.
    const std::string head = written.substr(at, head_end - at);
    const size_t length = head.find("Content-Length: ");
    at = head_end + 4;
    if (length != std::string::npos &&
        written.compare(at, 9, "HTTP/1.1 ") != 0) {
      at += std::strtoull(head.c_str() + length + 16, nullptr, 10);
    }
  }
  return 0;
}

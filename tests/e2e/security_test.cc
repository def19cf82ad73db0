// TLS, mTLS and the bearer token against a real normd, with throwaway
// certificates from openssl (tests/make_test_certs.sh): the right
// credentials work; none, a plaintext channel, a client certificate from
// another CA or a wrong token are refused (UNAUTHENTICATED where the server
// gets to answer; a failed handshake is UNAVAILABLE); health needs no token.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "client/client.h"
#include "client/tensor_io.h"
#include "tests/testing/server_process.h"

namespace normd {
namespace {

using ::normd::client::ClientOptions;
using ::normd::client::MakeTensor;
using ::normd::client::NormdClient;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(::testing::TempDir() + "/normd_certs_" +
                           std::to_string(getpid()));
    ASSERT_EQ(
        std::system((std::string(NORMD_MAKE_CERTS) + " " + *dir_).c_str()), 0);
  }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::string File(const std::string& name) {
    return *dir_ + "/" + name;
  }

  // TLS client options: trusting our CA, with `client` ("client",
  // "rogue-client" or "" for none) as its certificate.
  static ClientOptions Tls(const std::string& client) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Read(File("ca.crt"));
    if (!client.empty()) {
      ssl.pem_cert_chain = Read(File(client + ".crt"));
      ssl.pem_private_key = Read(File(client + ".key"));
    }
    ClientOptions options;
    options.credentials = grpc::SslCredentials(ssl);
    options.timeout = absl::Seconds(5);
    return options;
  }

  // A Fit through `options`: its status code.
  static absl::StatusCode FitCode(const std::string& target,
                                  ClientOptions options) {
    auto client = NormdClient::Connect(target, options);
    v1::FitRequest fit;
    fit.set_model("secure");
    *fit.mutable_input() = MakeTensor({2, 1}, {1, 2}, v1::FLOAT64);
    return client->Fit(fit).status().code();
  }

  static std::string* dir_;
};
std::string* SecurityTest::dir_ = nullptr;

TEST_F(SecurityTest, TlsServesTlsClientsOnly) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY, {"--tls_cert=" + File("server.crt"),
                                          "--tls_key=" + File("server.key")}))
      << server.log();
  EXPECT_NE(server.log().find("; TLS"), std::string::npos) << server.log();
  EXPECT_EQ(FitCode(server.target(), Tls("")), absl::StatusCode::kOk);
  ClientOptions plaintext;
  plaintext.timeout = absl::Seconds(5);
  EXPECT_EQ(FitCode(server.target(), plaintext),
            absl::StatusCode::kUnavailable);
  // A client that trusts another CA refuses the server.
  ClientOptions wrong_ca = Tls("");
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Read(File("rogue-ca.crt"));
  wrong_ca.credentials = grpc::SslCredentials(ssl);
  EXPECT_EQ(FitCode(server.target(), wrong_ca), absl::StatusCode::kUnavailable);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(SecurityTest, MutualTlsNeedsAClientCertificateFromTheCa) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY, {"--tls_cert=" + File("server.crt"),
                                          "--tls_key=" + File("server.key"),
                                          "--tls_client_ca=" + File("ca.crt")}))
      << server.log();
  EXPECT_EQ(FitCode(server.target(), Tls("client")), absl::StatusCode::kOk);
  // Refused in the handshake: gRPC reports it as UNAVAILABLE.
  EXPECT_EQ(FitCode(server.target(), Tls("")), absl::StatusCode::kUnavailable);
  EXPECT_EQ(FitCode(server.target(), Tls("rogue-client")),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(SecurityTest, BearerTokenGuardsEveryCallButHealth) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(NORMD_BINARY, {"--tls_cert=" + File("server.crt"),
                                          "--tls_key=" + File("server.key"),
                                          "--auth_token_file=" + File("token"),
                                          "--metrics_bind_address=127.0.0.1"}))
      << server.log();
  ClientOptions none = Tls("");
  const absl::StatusCode missing = FitCode(server.target(), none);
  EXPECT_EQ(missing, absl::StatusCode::kUnauthenticated);
  ClientOptions wrong = Tls("");
  wrong.bearer_token = "not-the-token";
  EXPECT_EQ(FitCode(server.target(), wrong),
            absl::StatusCode::kUnauthenticated);
  ClientOptions right = Tls("");
  right.bearer_token = Read(File("token"));
  right.bearer_token.pop_back();  // The file's newline.
  EXPECT_EQ(FitCode(server.target(), right), absl::StatusCode::kOk);

  // Every RPC is guarded, streams included; the message names the metadata.
  auto unauthenticated = NormdClient::Connect(server.target(), none);
  const absl::Status get = unauthenticated->GetModel("secure").status();
  EXPECT_EQ(get.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(get.message().find("authorization"), std::string::npos) << get;
  EXPECT_EQ(unauthenticated->ListModels().status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(unauthenticated->DeleteModel("secure").code(),
            absl::StatusCode::kUnauthenticated);
  v1::NormalizeRequest ln;
  ln.set_mode(v1::LAYER_NORM);
  *ln.mutable_input() = MakeTensor({2}, {1, 2});
  EXPECT_EQ(unauthenticated->NormalizeStream({ln}).status().code(),
            absl::StatusCode::kUnauthenticated);
  // Health answers without a token (load balancers and kubelets have none).
  auto health = unauthenticated->Health("normd.v1.Normalizer");
  ASSERT_TRUE(health.ok()) << health.status();
  // Nothing the refused calls did changed the model.
  auto model = NormdClient::Connect(server.target(), right)->GetModel("secure");
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->num_batches_tracked(), 1);
  // The metrics port listens on its own address.
  EXPECT_NE(testing::HttpGet(server.metrics_port(), "/metrics")
                .find("grpc_server_handled_total"),
            std::string::npos);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(SecurityTest, BadSecurityFlagsStopStartUpNamingTheFlag) {
  for (const auto& [flags, named] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tls_cert=" + File("server.crt")}, "--tls_key"},
           {{"--tls_client_ca=" + File("ca.crt")}, "--tls_client_ca"},
           {{"--tls_cert=/nonexistent.crt", "--tls_key=" + File("server.key")},
            "--tls_cert"},
           {{"--auth_token_file=/nonexistent"}, "--auth_token_file"}}) {
    testing::ServerProcess server;
    EXPECT_FALSE(server.Start(NORMD_BINARY, flags));
    EXPECT_NE(server.log().find(named), std::string::npos) << server.log();
  }
}

}  // namespace
}  // namespace normd

#include "server/rpc/grpc_transport.h"

#include "absl/strings/str_cat.h"
#include "server/service/flag_file.h"

namespace normd {

std::string HostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[') {
    return absl::StrCat("[", host, "]:", port);
  }
  return absl::StrCat(host, ":", port);
}

void ConfigureServerBuilder(
    const std::string& bind_address, int port, int64_t max_message_bytes,
    grpc::ServerBuilder& builder, int* bound_port,
    std::shared_ptr<grpc::ServerCredentials> credentials) {
  builder.AddListeningPort(HostPort(bind_address, port), std::move(credentials),
                           bound_port);
  // A second normd on a busy port must fail, not silently share it.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message_bytes));
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const TlsFiles& files) {
  if (files.cert.empty() && files.key.empty()) {
    if (!files.client_ca.empty()) {
      return absl::InvalidArgumentError(
          "--tls_client_ca: needs --tls_cert and --tls_key (mTLS is TLS with "
          "client certificates)");
    }
    return grpc::InsecureServerCredentials();
  }
  if (files.cert.empty() || files.key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key: give both (PEM certificate chain and its "
        "private key) or neither");
  }
  absl::StatusOr<std::string> cert = ReadFlagFile(files.cert, "--tls_cert");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadFlagFile(files.key, "--tls_key");
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl(
      GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!files.client_ca.empty()) {
    absl::StatusOr<std::string> ca =
        ReadFlagFile(files.client_ca, "--tls_client_ca");
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request =
        GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace normd

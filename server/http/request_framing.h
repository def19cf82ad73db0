// Strict HTTP/1.1 framing (RFC 9112) of a request whose head Beast has
// parsed: the checks Beast leaves to its user, and the answer to each of
// Beast's own parse errors. Beast already refuses Content-Length beside a
// chunked Transfer-Encoding, two different Content-Lengths and one that is
// not a decimal number; here a Transfer-Encoding other than exactly
// "chunked", one beside any Content-Length, a missing or repeated Host, and
// any version but HTTP/1.1 are refused too, so that normd and a proxy in
// front of it can never read one request's bytes as different messages.
// The one exception: HTTP/1.0 GETs of the health endpoints, without a body,
// as load balancers' checks send them (HAProxy's httpchk).
// Shared by the connection and the fuzzer, so that both apply the same
// rules. Stateless; thread-safe.
#ifndef NORMD_SERVER_HTTP_REQUEST_FRAMING_H_
#define NORMD_SERVER_HTTP_REQUEST_FRAMING_H_

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <optional>
#include <string>

#include "server/http/rest_api.h"

namespace normd {

// An answer that ends the connection: its status and message.
struct FramingRefusal {
  int status = 400;
  std::string message;
};

// The refusal of a request whose head Beast parsed, or nullopt when its
// framing is sound.
std::optional<FramingRefusal> CheckFraming(
    const boost::beast::http::request_header<>& head);

// The answer to Beast's error `error` while it read a request:
// header_limit 431 naming --http_max_header_bytes, body_limit 413 naming
// --max_message_bytes, anything else 400 saying what was malformed.
FramingRefusal RefusalOfParseError(const boost::beast::error_code& error);

// What the REST API needs of a request whose head `parser` has parsed (and
// CheckFraming passed).
RestRequestHead HeadOf(
    const boost::beast::http::request_parser<boost::beast::http::string_body>&
        parser);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REQUEST_FRAMING_H_

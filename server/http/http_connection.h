// One REST connection, event-driven on Asio: it reads each request in the
// order api.md gives and answers it, until the client closes, the
// connection idles past --http_idle_timeout, or an answer ends it.
//   1. Line and headers (Beast's strict parser), at most
//      --http_max_header_bytes (431), within --http_header_timeout of the
//      request's first byte (408); framing checked (request_framing.h).
//   2. Route, token and admission (RestApi::Admit): refused at once, the
//      body not read; the connection then closes after lingering.
//   3. Body: within --http_body_timeout, and after its first second at no
//      less than --http_min_body_rate on average (408); a chunked body is
//      admitted as it arrives.
//   4. Parsing and computing in the compute arena, never on an I/O thread;
//      the answer is written back on the connection's executor.
// Every deadline is a timer that cancels the pending read, so that the
// client is told why (408) before the connection is closed.
//
// Thread-safe: a connection's handlers run one at a time (on its own strand,
// or on the one I/O thread); ConnectionHub is shared by all of them and by
// the server.
#ifndef NORMD_SERVER_HTTP_HTTP_CONNECTION_H_
#define NORMD_SERVER_HTTP_HTTP_CONNECTION_H_

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>

#include "server/http/connection_hub.h"

namespace normd {

// Serves an accepted connection (plain TCP, or TLS with `tls`).
void ServeConnection(ConnectionHub& hub, boost::asio::ip::tcp::socket socket,
                     boost::asio::ssl::context* tls);

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_HTTP_CONNECTION_H_

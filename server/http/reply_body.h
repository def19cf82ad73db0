// The Beast body type of a REST answer: its JSON text, then its binary
// payload (a pooled buffer), written from where they are with no copy into
// one buffer. A value, used by the one connection writing it.
#ifndef NORMD_SERVER_HTTP_REPLY_BODY_H_
#define NORMD_SERVER_HTTP_REPLY_BODY_H_

#include <array>
#include <boost/asio/buffer.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/optional.hpp>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "server/service/buffer_pool.h"

namespace normd {

struct ReplyBody {
  struct value_type {
    std::string json;
    PooledBuffer payload{nullptr, &BufferPool::Release};
    size_t payload_bytes = 0;
  };

  static std::uint64_t size(const value_type& body) {
    return body.json.size() + body.payload_bytes;
  }

  class writer {
   public:
    using const_buffers_type = std::array<boost::asio::const_buffer, 2>;

    template <bool isRequest, class Fields>
    writer(const boost::beast::http::header<isRequest, Fields>&,
           const value_type& body)
        : body_(body) {}

    void init(boost::beast::error_code& ec) { ec = {}; }

    boost::optional<std::pair<const_buffers_type, bool>> get(
        boost::beast::error_code& ec) {
      ec = {};
      if (done_) return boost::none;
      done_ = true;
      return std::make_pair(
          const_buffers_type{
              boost::asio::buffer(body_.json),
              boost::asio::buffer(body_.payload.get(), body_.payload_bytes)},
          false);
    }

   private:
    const value_type& body_;
    bool done_ = false;
  };
};

}  // namespace normd

#endif  // NORMD_SERVER_HTTP_REPLY_BODY_H_

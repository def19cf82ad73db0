// normctl's --json rendering of replies: protobuf messages as JSON in which
// numbers stay numbers. Proto3's JSON mapping writes int64 as strings and
// bytes as base64, so a shape comes out as ["2", "3"] and a tensor's data as
// an opaque string; here int64 and uint64 are JSON numbers, and a
// normd.v1.Tensor's `data` is decoded (by its dtype) into a flat list of
// numbers in row-major order. Enums print by name; non-finite doubles as
// "NaN", "Infinity" and "-Infinity", as proto3 JSON does. Field names are
// the .proto's. Stateless; thread-safe.
#ifndef NORMD_CLIENT_JSON_OUTPUT_H_
#define NORMD_CLIENT_JSON_OUTPUT_H_

#include <google/protobuf/message.h>

#include <string>

#include "absl/strings/string_view.h"

namespace normd::client {

// `message` as indented JSON. With `all_fields`, scalar fields at their
// default value are written too (a complete state).
std::string MessageToJson(const google::protobuf::Message& message,
                          bool all_fields = false);

// `text` as a JSON string literal, quotes included.
std::string JsonString(absl::string_view text);

}  // namespace normd::client

#endif  // NORMD_CLIENT_JSON_OUTPUT_H_

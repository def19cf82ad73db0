// The binary encoding of models and store mutations in normd's state files
// (snapshots and the write-ahead log): little-endian fixed-width integers and
// IEEE doubles, length-prefixed strings and arrays. Decoding checks every
// length against the bytes left and every model against its own invariants,
// so that no input, however corrupt, can crash or over-allocate.
// Plain functions and value types; thread-compatible.
#ifndef NORMD_SERVER_STATE_CODEC_H_
#define NORMD_SERVER_STATE_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/core/model.h"
#include "server/core/mutation_log.h"
#include "server/state/state_files.h"

namespace normd::state {

// Appends encoded values to a string.
class ByteWriter {
 public:
  explicit ByteWriter(std::string& out) : out_(out) {}
  // Makes room for `bytes` more without changing what is written.
  void Reserve(size_t bytes) { out_.reserve(out_.size() + bytes); }
  void PutU8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void PutU32(uint32_t v);
  void PutU64(uint64_t v);
  void PutI64(int64_t v) { PutU64(static_cast<uint64_t>(v)); }
  void PutDouble(double v);
  void PutString(absl::string_view s);
  void PutDoubles(absl::Span<const double> values);

 private:
  std::string& out_;
};

// Reads encoded values; any read past the end fails and leaves ok() false.
class ByteReader {
 public:
  explicit ByteReader(absl::string_view in) : in_(in) {}
  bool GetU8(uint8_t* v);
  bool GetU32(uint32_t* v);
  bool GetU64(uint64_t* v);
  bool GetI64(int64_t* v);
  bool GetDouble(double* v);
  bool GetString(std::string* s);
  bool GetDoubles(std::vector<double>* values);
  size_t remaining() const { return in_.size(); }

 private:
  bool Take(size_t n, const char** bytes);
  absl::string_view in_;
};

// Encodes in kFormatVersion.
void EncodeModel(const BatchNormModel& model, ByteWriter& out);
// Reads one model of format `version`. INVALID_ARGUMENT, saying why, if the
// bytes end early or the model fails ValidateModel (the rule every model the
// store holds was checked against).
absl::Status DecodeModel(ByteReader& in, BatchNormModel* model,
                         uint32_t version = kFormatVersion);

// Encodes in kFormatVersion.
void EncodeMutation(const Mutation& mutation, ByteWriter& out);

// A decoded Mutation that owns its data.
struct MutationRecord {
  Mutation::Kind kind = Mutation::Kind::kCreate;
  std::string name;
  BatchNormModel model;                 // kCreate, kPut.
  std::vector<Moments> batch;           // kTrain, kTrainInstance.
  std::vector<double> running_targets;  // kTrainInstance.
  std::vector<BatchNormModel> models;   // kCreateAll.
};
// INVALID_ARGUMENT, saying why, unless the bytes are exactly one
// well-formed mutation.
absl::Status DecodeMutation(absl::string_view bytes, MutationRecord* record,
                            uint32_t version = kFormatVersion);

// CRC-32 (zlib's polynomial) of `bytes`, continuing from `crc`.
uint32_t Crc32(absl::string_view bytes, uint32_t crc = 0);
// Crc32 of A followed by B, from Crc32(A), Crc32(B) and B's length.
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, size_t length_b);

}  // namespace normd::state

#endif  // NORMD_SERVER_STATE_CODEC_H_

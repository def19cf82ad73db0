#include "server/state/codec.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace normd::state {
namespace {

static_assert(sizeof(double) == 8 && std::numeric_limits<double>::is_iec559);

bool DecodeMoments(ByteReader& in, Moments* m) {
  return in.GetI64(&m->count) && in.GetDouble(&m->mean) &&
         in.GetDouble(&m->m2) && m->count >= 0;
}

}  // namespace

namespace {

// Little-endian bytes of `v`, whatever the host's byte order; compilers turn
// the shifts into one store on little-endian hosts.
template <typename T>
void AppendLittleEndian(T v, std::string& out) {
  char bytes[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) {
    bytes[i] = static_cast<char>(v >> (8 * i));
  }
  out.append(bytes, sizeof(T));
}

}  // namespace

void ByteWriter::PutU32(uint32_t v) { AppendLittleEndian(v, out_); }

void ByteWriter::PutU64(uint64_t v) { AppendLittleEndian(v, out_); }

void ByteWriter::PutDouble(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  PutU64(bits);
}

void ByteWriter::PutString(absl::string_view s) {
  PutU32(static_cast<uint32_t>(s.size()));
  out_.append(s.data(), s.size());
}

void ByteWriter::PutDoubles(absl::Span<const double> values) {
  PutU64(values.size());
  Reserve(sizeof(double) * values.size());
  for (double v : values) PutDouble(v);
}

bool ByteReader::Take(size_t n, const char** bytes) {
  if (n > in_.size()) {
    in_ = absl::string_view();
    return false;
  }
  *bytes = in_.data();
  in_.remove_prefix(n);
  return true;
}

bool ByteReader::GetU8(uint8_t* v) {
  const char* p;
  if (!Take(1, &p)) return false;
  *v = static_cast<uint8_t>(*p);
  return true;
}

bool ByteReader::GetU32(uint32_t* v) {
  const char* p;
  if (!Take(4, &p)) return false;
  *v = 0;
  for (int i = 0; i < 4; ++i) {
    *v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return true;
}

bool ByteReader::GetU64(uint64_t* v) {
  const char* p;
  if (!Take(8, &p)) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i) {
    *v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  }
  return true;
}

bool ByteReader::GetI64(int64_t* v) {
  uint64_t u;
  if (!GetU64(&u)) return false;
  *v = static_cast<int64_t>(u);
  return true;
}

bool ByteReader::GetDouble(double* v) {
  uint64_t bits;
  if (!GetU64(&bits)) return false;
  std::memcpy(v, &bits, sizeof bits);
  return true;
}

bool ByteReader::GetString(std::string* s) {
  uint32_t size;
  const char* p;
  if (!GetU32(&size) || !Take(size, &p)) return false;
  s->assign(p, size);
  return true;
}

bool ByteReader::GetDoubles(std::vector<double>* values) {
  uint64_t count;
  if (!GetU64(&count) || count > in_.size() / 8) return false;
  values->resize(count);
  for (double& v : *values) GetDouble(&v);
  return true;
}

void EncodeModel(const BatchNormModel& model, ByteWriter& out) {
  out.PutString(model.name);
  out.PutI64(model.num_features);
  out.PutDouble(model.momentum);
  out.PutU8(model.cumulative_average);
  out.PutDouble(model.eps);
  out.PutU8(model.use_pooled_statistics);
  out.PutI64(model.num_batches_tracked);
  out.PutI64(model.sample_count);
  out.PutDoubles(model.running_mean);
  out.PutDoubles(model.running_var);
  out.PutDoubles(model.weight);
  out.PutDoubles(model.bias);
  out.PutU64(model.pooled.size());
  for (const Moments& m : model.pooled) {
    out.PutI64(m.count);
    out.PutDouble(m.mean);
    out.PutDouble(m.m2);
  }
  out.PutU64(model.generation);
  out.PutU8(model.reference.has_value() ? 1 : 0);
  if (model.reference.has_value()) {
    out.PutU8(static_cast<uint8_t>(model.reference->source));
    out.PutI64(model.reference->set_unix_nanos);
    out.PutDoubles(model.reference->mean);
    out.PutDoubles(model.reference->var);
  }
}

absl::Status DecodeModel(ByteReader& in, BatchNormModel* model,
                         uint32_t version) {
  uint8_t cumulative = 0, pooled_stats = 0;
  uint64_t pooled_count = 0;
  bool complete =
      in.GetString(&model->name) && in.GetI64(&model->num_features) &&
      in.GetDouble(&model->momentum) && in.GetU8(&cumulative) &&
      in.GetDouble(&model->eps) && in.GetU8(&pooled_stats) &&
      in.GetI64(&model->num_batches_tracked) &&
      in.GetI64(&model->sample_count) && in.GetDoubles(&model->running_mean) &&
      in.GetDoubles(&model->running_var) && in.GetDoubles(&model->weight) &&
      in.GetDoubles(&model->bias) && in.GetU64(&pooled_count) &&
      pooled_count <= in.remaining() / 24;
  if (complete) {
    model->pooled.resize(pooled_count);
    for (Moments& m : model->pooled) {
      complete = complete && in.GetI64(&m.count) && in.GetDouble(&m.mean) &&
                 in.GetDouble(&m.m2);
    }
    complete = complete && in.GetU64(&model->generation);
  }
  uint8_t has_reference = 0;
  if (complete && version >= 2) {
    complete = in.GetU8(&has_reference) && has_reference <= 1;
  }
  if (complete && has_reference == 1) {
    uint8_t source = 0;
    DriftReference& reference = model->reference.emplace();
    complete = in.GetU8(&source) && in.GetI64(&reference.set_unix_nanos) &&
               in.GetDoubles(&reference.mean) && in.GetDoubles(&reference.var);
    reference.source = static_cast<ReferenceSource>(source);
  }
  if (!complete) {
    return absl::InvalidArgumentError("the bytes end inside the model");
  }
  model->cumulative_average = cumulative != 0;
  model->use_pooled_statistics = pooled_stats != 0;
  // Counts, sizes and values: the rule every stored model was checked with.
  return ValidateModel(*model);
}

void EncodeMutation(const Mutation& mutation, ByteWriter& out) {
  out.PutU8(static_cast<uint8_t>(mutation.kind));
  out.PutString(mutation.name);
  switch (mutation.kind) {
    case Mutation::Kind::kCreate:
    case Mutation::Kind::kPut:
      EncodeModel(*mutation.model, out);
      break;
    case Mutation::Kind::kTrain:
    case Mutation::Kind::kTrainInstance:
      out.Reserve(sizeof(uint64_t) +
                  3 * sizeof(uint64_t) * mutation.batch.size());
      out.PutU64(mutation.batch.size());
      for (const Moments& m : mutation.batch) {
        out.PutI64(m.count);
        out.PutDouble(m.mean);
        out.PutDouble(m.m2);
      }
      if (mutation.kind == Mutation::Kind::kTrainInstance) {
        out.PutDoubles(mutation.running_targets);
      }
      break;
    case Mutation::Kind::kDelete:
    case Mutation::Kind::kReset:
      break;
    case Mutation::Kind::kCreateAll:
      out.PutU64(mutation.models.size());
      for (const BatchNormModel& model : mutation.models) {
        EncodeModel(model, out);
      }
      break;
  }
}

absl::Status DecodeMutation(absl::string_view bytes, MutationRecord* record,
                            uint32_t version) {
  ByteReader in(bytes);
  uint8_t kind;
  if (!in.GetU8(&kind) || !in.GetString(&record->name)) {
    return absl::InvalidArgumentError("the bytes end inside the record");
  }
  // A kCreateAll record names its models inside, each.
  if (static_cast<Mutation::Kind>(kind) == Mutation::Kind::kCreateAll) {
    if (!record->name.empty()) {
      return absl::InvalidArgumentError(
          "a record that creates several models has a name of its own");
    }
  } else if (absl::Status s = ValidateModelName(record->name, "name");
             !s.ok()) {
    return s;
  }
  switch (static_cast<Mutation::Kind>(kind)) {
    case Mutation::Kind::kCreate:
    case Mutation::Kind::kPut:
      if (absl::Status s = DecodeModel(in, &record->model, version); !s.ok())
        return s;
      if (record->model.name != record->name) {
        return absl::InvalidArgumentError(
            "the record's model has another name than the record");
      }
      break;
    case Mutation::Kind::kTrain:
    case Mutation::Kind::kTrainInstance: {
      uint64_t channels;
      if (!in.GetU64(&channels) || channels == 0 ||
          channels > in.remaining() / 24) {
        return absl::InvalidArgumentError(
            "the channel count is 0 or past the record's end");
      }
      record->batch.resize(channels);
      for (Moments& m : record->batch) {
        if (!DecodeMoments(in, &m)) {
          return absl::InvalidArgumentError("a batch moment is malformed");
        }
      }
      if (static_cast<Mutation::Kind>(kind) == Mutation::Kind::kTrainInstance &&
          (!in.GetDoubles(&record->running_targets) ||
           record->running_targets.size() != 2 * channels)) {
        return absl::InvalidArgumentError(
            "the running targets are not 2 per channel");
      }
      break;
    }
    case Mutation::Kind::kDelete:
    case Mutation::Kind::kReset:
      break;
    case Mutation::Kind::kCreateAll: {
      // Every encoded model takes more than 64 bytes: the count is bounded
      // by the record before anything is allocated for it.
      uint64_t count;
      if (!in.GetU64(&count) || count == 0 || count > in.remaining() / 64) {
        return absl::InvalidArgumentError(
            "the model count is 0 or past the record's end");
      }
      record->models.resize(count);
      absl::flat_hash_set<absl::string_view> names;
      for (BatchNormModel& model : record->models) {
        if (absl::Status s = DecodeModel(in, &model, version); !s.ok())
          return s;
        if (!names.insert(model.name).second) {
          return absl::InvalidArgumentError(absl::StrCat(
              "the record creates model '", model.name, "' twice"));
        }
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown record kind ", kind));
  }
  record->kind = static_cast<Mutation::Kind>(kind);
  if (in.remaining() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(in.remaining(), " bytes after the record's end"));
  }
  return absl::OkStatus();
}

uint32_t Crc32(absl::string_view bytes, uint32_t crc) {
  // zlib takes uInt lengths: feed it in chunks.
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = static_cast<uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(bytes.data()),
              static_cast<uInt>(n)));
    bytes.remove_prefix(n);
  }
  return crc;
}

uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, size_t length_b) {
  return static_cast<uint32_t>(
      crc32_combine(crc_a, crc_b, static_cast<z_off_t>(length_b)));
}

}  // namespace normd::state

// libFuzzer target over sequences of model-store operations, the in-process
// twin of tests/state/state_property_test.py: the bytes choose
// operations (create, create several at once, import, training and InstanceNorm
// steps with any moments, merges of a model into itself or another, resets,
// deletes) on a few names, with counters and statistics from a table of
// extremes or raw bit patterns. After every accepted operation:
//   - every model the store holds passes ValidateModel;
//   - its snapshot encoding decodes back to the same bytes;
//   - every log record written so far decodes, and replaying them (as
//     recovery does) onto a second store gives exactly the same models.
// A refused operation must leave the store and the log as they were. Any
// violation aborts.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "server/core/model.h"
#include "server/core/model_store.h"
#include "server/core/mutation_log.h"
#include "server/state/codec.h"
#include "server/state/durable_state.h"

namespace {

using normd::BatchNormModel;
using normd::ModelStore;
using normd::Moments;
using normd::Mutation;

void Fail(const std::string& what) {
  std::fprintf(stderr, "ops_fuzzer: %s\n", what.c_str());
  std::abort();
}

// Reads the fuzzer's bytes; zeros once they run out.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint64_t U64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | Byte();
    return v;
  }
  // A counter: small, or near the top of int64.
  int64_t Count() {
    constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
    const int64_t table[] = {0, 1, 2, 3, 10, kMax - 1, kMax, -1};
    return table[Byte() % 8];
  }
  // A double: ordinary, extreme, or any bit pattern (NaN and Inf too).
  double Value() {
    const double table[] = {0.0,      1.0,   -2.5,  1e-300,  1e154,
                            -1e154,   1e200, 1e300, 1.7e308, -1.7e308,
                            4.9e-324, 3.0,   0.1,   -0.5,    7.0};
    const uint8_t pick = Byte();
    if (pick < 240) return table[pick % 15];
    double v;
    const uint64_t bits = U64();
    std::memcpy(&v, &bits, sizeof v);
    return v;
  }
  std::vector<double> Values(int64_t n) {
    std::vector<double> out(n);
    for (double& v : out) v = Value();
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// Keeps every record the store logs, encoded as DurableState would.
class RecordingLog final : public normd::MutationLog {
 public:
  absl::Status Healthy() override { return absl::OkStatus(); }
  uint64_t Append(const Mutation& mutation) override {
    std::string payload;
    normd::state::ByteWriter writer(payload);
    normd::state::EncodeMutation(mutation, writer);
    records.push_back(std::move(payload));
    return records.size();
  }
  absl::Status WaitDurable(uint64_t) override { return absl::OkStatus(); }
  void OnDurable(uint64_t, std::function<void(absl::Status)> done) override {
    done(absl::OkStatus());
  }
  std::vector<std::string> records;
};

// The snapshot encoding of every model, in name order.
std::string Encoded(const ModelStore& store) {
  std::string out;
  normd::state::ByteWriter writer(out);
  for (const BatchNormModel& model : store.List(/*with_arrays=*/true)) {
    normd::state::EncodeModel(model, writer);
  }
  return out;
}

void CheckStore(const ModelStore& store) {
  for (const BatchNormModel& model : store.List(/*with_arrays=*/true)) {
    if (absl::Status s = normd::ValidateModel(model); !s.ok()) {
      Fail("the store holds an invalid model: " + std::string(s.message()));
    }
    std::string bytes;
    normd::state::ByteWriter writer(bytes);
    normd::state::EncodeModel(model, writer);
    normd::state::ByteReader reader(bytes);
    BatchNormModel decoded;
    if (absl::Status s = normd::state::DecodeModel(reader, &decoded); !s.ok()) {
      Fail("a stored model does not decode: " + std::string(s.message()));
    }
    std::string again;
    normd::state::ByteWriter again_writer(again);
    normd::state::EncodeModel(decoded, again_writer);
    if (again != bytes) Fail("a model's encoding does not round-trip");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  ModelStore store(
      {.max_models = 6, .max_num_features = 8, .max_model_bytes = 4000});
  RecordingLog log;
  store.SetMutationLog(&log);
  ModelStore replica;  // Fed the log records, as recovery would be.
  size_t replayed = 0;
  const char* const names[] = {"a", "b", "c", "d"};
  for (int op = 0; op < 200 && !in.empty(); ++op) {
    const uint8_t kind = in.Byte() % 10;
    const std::string name = names[in.Byte() % 4];
    const int64_t channels = 1 + in.Byte() % 4;
    const std::string before = Encoded(store);
    const size_t logged = log.records.size();
    absl::Status status;
    switch (kind) {
      case 0: {  // CreateModel.
        normd::ModelSpec spec;
        spec.name = name;
        spec.num_features = channels;
        if (in.Byte() & 1) spec.momentum = in.Value();
        spec.cumulative_average = in.Byte() & 1;
        if (in.Byte() & 1) spec.eps = in.Value();
        if (in.Byte() & 1) spec.running_mean = in.Values(channels);
        if (in.Byte() & 1) spec.running_var = in.Values(channels);
        spec.num_batches_tracked = in.Count();
        status = store.Create(spec).status();
        break;
      }
      case 1: {  // ImportModel.
        normd::ModelStateSpec state;
        state.config.name = name;
        state.config.num_features = channels;
        state.config.running_mean = in.Values(channels);
        state.config.num_batches_tracked = in.Count();
        state.sample_count = in.Count();
        if (state.sample_count > 0) {
          state.pooled_mean = in.Values(channels);
          state.pooled_m2 = in.Values(channels);
        }
        state.generation = in.U64();
        absl::StatusOr<BatchNormModel> model =
            normd::MakeModelFromState(state, "model.");
        status = model.ok() ? store.Put(*model, in.Byte() & 1).status()
                            : model.status();
        break;
      }
      case 2:
      case 3: {  // A training step with any moments.
        std::vector<Moments> batch(channels);
        const int64_t count =
            in.Byte() % 2 == 0 ? 1 + in.Byte() % 4 : in.Count();
        for (Moments& m : batch) {
          m = {.count = count, .mean = in.Value(), .m2 = std::fabs(in.Value())};
        }
        status = store.Train(name, batch).status();
        break;
      }
      case 4: {  // An InstanceNorm step.
        std::vector<Moments> pooled(channels);
        const int64_t count = 1 + in.Byte() % 8;
        for (Moments& m : pooled) {
          m = {.count = count, .mean = in.Value(), .m2 = std::fabs(in.Value())};
        }
        status =
            store.TrainInstance(name, pooled, in.Values(2 * channels)).status();
        break;
      }
      case 5: {  // MergeModel: another model, or the model itself.
        absl::StatusOr<BatchNormModel> source = store.Get(names[in.Byte() % 4]);
        status =
            source.ok() ? store.Merge(name, *source).status() : source.status();
        break;
      }
      case 6:
        status = store.Reset(name).status();
        break;
      case 7:
        status = store.Delete(name);
        break;
      case 9: {  // CreateModels: 1-3 models at once, names may repeat.
        std::vector<normd::ModelSpec> specs(1 + in.Byte() % 3);
        for (size_t i = 0; i < specs.size(); ++i) {
          specs[i].name = i == 0 ? name : names[in.Byte() % 4];
          specs[i].num_features = 1 + in.Byte() % 4;
          if (in.Byte() & 1) specs[i].momentum = in.Value();
          if (in.Byte() & 1) {
            specs[i].running_var = in.Values(specs[i].num_features);
          }
          specs[i].num_batches_tracked = in.Count();
        }
        status = store.CreateAll(specs).status();
        break;
      }
      case 8: {  // Import of an export under another name.
        absl::StatusOr<BatchNormModel> exported = store.Get(name);
        if (exported.ok()) {
          exported->name = names[in.Byte() % 4];
          status = store.Put(*exported, false).status();
        }
        break;
      }
    }
    if (!status.ok()) {
      if (status.code() == absl::StatusCode::kInternal ||
          status.code() == absl::StatusCode::kUnknown ||
          status.code() == absl::StatusCode::kDataLoss) {
        Fail("a server-side error: " + status.ToString());
      }
      if (Encoded(store) != before || log.records.size() != logged) {
        Fail("a refused operation changed the store or the log: " +
             status.ToString());
      }
      continue;
    }
    CheckStore(store);
    for (; replayed < log.records.size(); ++replayed) {
      normd::state::MutationRecord record;
      if (absl::Status s =
              normd::state::DecodeMutation(log.records[replayed], &record);
          !s.ok()) {
        Fail("a log record does not decode: " + std::string(s.message()));
      }
      if (absl::Status s = normd::state::ReplayRecord(replica, record);
          !s.ok()) {
        Fail("a log record does not replay: " + s.ToString());
      }
    }
    if (Encoded(replica) != Encoded(store)) {
      Fail("replaying the log does not give the store's models");
    }
  }
  return 0;
}

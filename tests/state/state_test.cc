// Durable state (server/state): a store recovered from its state directory is
// bitwise the store that wrote it, through snapshots, log rotation, torn
// tails and concurrent writers; damage other than a torn tail stops recovery
// with an error naming the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "server/core/engine.h"
#include "server/core/model_store.h"
#include "server/state/codec.h"
#include "server/state/durable_state.h"
#include "tests/testing/reference.h"
#include "tests/testing/temp_dir.h"

namespace normd::state {
namespace {

namespace fs = std::filesystem;

std::string FreshDir(const std::string& name) {
  return testing::FreshTempDir("normd_state_test", name);
}

std::vector<Moments> RandomBatch(std::mt19937_64& rng, int64_t channels) {
  std::uniform_real_distribution<double> value(-100, 100);
  std::vector<Moments> batch(channels);
  const int64_t count = 1 + static_cast<int64_t>(rng() % 5);
  for (Moments& m : batch) {
    m.count = count;
    m.mean = value(rng);
    m.m2 = count > 1 ? std::abs(value(rng)) * count : 0.0;
  }
  return batch;
}

// Every field, bitwise (doubles compared by representation via ==, and NaN
// never occurs in these states).
void ExpectSameModels(const std::vector<BatchNormModel>& a,
                      const std::vector<BatchNormModel>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    SCOPED_TRACE(a[i].name);
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(a[i].num_features, b[i].num_features);
    EXPECT_EQ(a[i].momentum, b[i].momentum);
    EXPECT_EQ(a[i].cumulative_average, b[i].cumulative_average);
    EXPECT_EQ(a[i].eps, b[i].eps);
    EXPECT_EQ(a[i].use_pooled_statistics, b[i].use_pooled_statistics);
    EXPECT_EQ(a[i].num_batches_tracked, b[i].num_batches_tracked);
    EXPECT_EQ(a[i].sample_count, b[i].sample_count);
    EXPECT_EQ(a[i].running_mean, b[i].running_mean);
    EXPECT_EQ(a[i].running_var, b[i].running_var);
    EXPECT_EQ(a[i].weight, b[i].weight);
    EXPECT_EQ(a[i].bias, b[i].bias);
    EXPECT_EQ(a[i].PooledMean(), b[i].PooledMean());
    EXPECT_EQ(a[i].PooledVariance(), b[i].PooledVariance());
    EXPECT_EQ(a[i].generation, b[i].generation);
    ASSERT_EQ(a[i].reference.has_value(), b[i].reference.has_value());
    if (a[i].reference.has_value()) {
      EXPECT_EQ(a[i].reference->source, b[i].reference->source);
      EXPECT_EQ(a[i].reference->set_unix_nanos, b[i].reference->set_unix_nanos);
      EXPECT_EQ(a[i].reference->mean, b[i].reference->mean);
      EXPECT_EQ(a[i].reference->var, b[i].reference->var);
    }
  }
}

// A model of `channels` channels holding random statistics, as ImportModel
// would store it.
BatchNormModel RandomModel(std::mt19937_64& rng, const std::string& name,
                           int64_t channels) {
  BatchNormModel model = MakeDefaultModel(name, channels);
  EXPECT_TRUE(ApplyTrainingStep(model, RandomBatch(rng, channels)).ok());
  model.num_batches_tracked += static_cast<int64_t>(rng() % 4);
  model.generation = 1 + rng() % 5;
  if (rng() % 2 == 0) {
    model.reference = DriftReference{
        .source = ReferenceSource::kExplicit,
        .set_unix_nanos = static_cast<int64_t>(rng() % 1000),
        .mean = std::vector<double>(channels, -0.5),
        .var = std::vector<double>(channels, 0.25 * (1 + rng() % 4))};
  }
  return model;
}

// Merges the current state of another model of the same channel count
// (channel counts follow the name's digit) into `name`, if both exist.
void MergeSibling(ModelStore& store, const std::string& name,
                  const std::string& sibling) {
  absl::StatusOr<BatchNormModel> source = store.Get(sibling);
  if (source.ok()) (void)store.Merge(name, *source);  // NOT_FOUND is fine.
}

// Applies `steps` random changes (create, train, InstanceNorm train, reset,
// delete, import, merge, create several at once) to `store`.
void RandomChanges(ModelStore& store, int steps, uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (int i = 0; i < steps; ++i) {
    const std::string name = "m" + std::to_string(rng() % 6);
    const int64_t channels = 1 + static_cast<int64_t>(name.back() - '0');
    switch (rng() % 15) {
      case 13: {
        const ReferenceSource source =
            std::array{ReferenceSource::kRunning, ReferenceSource::kPooled,
                       ReferenceSource::kExplicit}[rng() % 3];
        ReferenceRequest request{.source = source};
        if (source == ReferenceSource::kExplicit) {
          request.mean.assign(channels, static_cast<double>(rng() % 100));
          request.var.assign(channels, 1.0 + rng() % 3);
        }
        // NOT_FOUND, and pooled statistics of a fresh model: fine.
        (void)store.SetReference(name, request);
        break;
      }
      case 14:
        (void)store.ClearReference(name);
        break;
      case 12: {
        // With "k<digit>" of another channel count; ALREADY_EXISTS is fine.
        std::vector<ModelSpec> specs = {
            {.name = name, .num_features = channels, .momentum = 0.5},
            {.name = "k" + name.substr(1),
             .num_features = channels + 1,
             .eps = 1e-2,
             .running_var = std::vector<double>(channels + 1, 3.5)}};
        (void)store.CreateAll(specs);
        break;
      }
      case 10:
        (void)store.Put(RandomModel(rng, name, channels),
                        /*create_only=*/(rng() & 1) != 0);
        break;
      case 11:
        // "m1" and "n1" share a channel count.
        MergeSibling(store, name, "n" + name.substr(1));
        MergeSibling(store, "n" + name.substr(1), name);
        if (!store.Get("n" + name.substr(1)).ok()) {
          (void)store.Put(RandomModel(rng, "n" + name.substr(1), channels),
                          /*create_only=*/true);
        }
        break;
      case 0: {
        ModelSpec spec;
        spec.name = name;
        spec.num_features = channels;
        spec.momentum = 0.25;
        spec.eps = 1e-3;
        spec.weight.assign(channels, 2.0);
        (void)store.Create(spec);  // ALREADY_EXISTS is fine.
        break;
      }
      case 1:
        (void)store.Reset(name);
        break;
      case 2:
        (void)store.Delete(name);
        break;
      case 3: {
        std::vector<double> targets(2 * channels);
        for (double& t : targets) t = static_cast<double>(rng() % 1000) / 7;
        ASSERT_TRUE(
            store.TrainInstance(name, RandomBatch(rng, channels), targets)
                .ok());
        break;
      }
      default:
        ASSERT_TRUE(store.Train(name, RandomBatch(rng, channels)).ok());
    }
  }
}

struct Opened {
  std::unique_ptr<ModelStore> store = std::make_unique<ModelStore>();
  std::unique_ptr<DurableState> state;
  RecoveryReport report;
};

Opened Open(const std::string& dir, int64_t snapshot_log_bytes = 64 << 20) {
  Opened o;
  auto state =
      DurableState::Open({dir, snapshot_log_bytes}, *o.store, &o.report);
  EXPECT_TRUE(state.ok()) << state.status();
  if (state.ok()) o.state = std::move(*state);
  return o;
}

absl::Status OpenStatus(const std::string& dir) {
  ModelStore store;
  RecoveryReport report;
  return DurableState::Open({dir, 64 << 20}, store, &report).status();
}

std::vector<std::string> FilesIn(const std::string& dir, const char* prefix) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(prefix, 0) == 0) {
      out.push_back(e.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(DurableStateTest, RecoversExactlyWhatWasWrittenWithoutSnapshot) {
  const std::string dir = FreshDir("replay");
  std::vector<BatchNormModel> before;
  {
    Opened o = Open(dir);
    RandomChanges(*o.store, 400, 1);
    before = o.store->List(/*with_arrays=*/true);
    ASSERT_GE(before.size(), 3u);
    // Simulates a crash: no Close, so no final snapshot; the log has it all.
  }
  Opened o = Open(dir);
  EXPECT_GT(o.report.records_replayed, 300);
  ExpectSameModels(before, o.store->List(true));
  // Recovery wrote a snapshot and started an empty log.
  EXPECT_EQ(FilesIn(dir, "snapshot-").size(), 1u);
  EXPECT_EQ(FilesIn(dir, "wal-").size(), 1u);
}

TEST(DurableStateTest, RotatesIntoSnapshotsAndDropsCoveredLog) {
  const std::string dir = FreshDir("rotate");
  std::vector<BatchNormModel> before;
  {
    Opened o = Open(dir, /*snapshot_log_bytes=*/2048);
    RandomChanges(*o.store, 600, 2);
    ASSERT_TRUE(o.state->Snapshot().ok());
    RandomChanges(*o.store, 50, 3);  // After the last snapshot: log only.
    before = o.store->List(true);
  }
  EXPECT_EQ(FilesIn(dir, "snapshot-").size(), 1u);
  EXPECT_LE(FilesIn(dir, "wal-").size(), 2u);
  Opened o = Open(dir);
  EXPECT_FALSE(o.report.snapshot_file.empty());
  ExpectSameModels(before, o.store->List(true));
}

// Counts what a DurableState reports.
struct CountingObserver : DurabilityObserver {
  std::atomic<int64_t> syncs = 0, records = 0, snapshots = 0, failures = 0;
  void OnSync(int64_t r, int64_t, double) override {
    ++syncs;
    records += r;
  }
  void OnSnapshot(int64_t, double) override { ++snapshots; }
  void OnFailure(const absl::Status&) override { ++failures; }
};

TEST(DurableStateTest, ConcurrentWritersShareSyncsAndSnapshotsStayConsistent) {
  const std::string dir = FreshDir("concurrent");
  CountingObserver observer;
  constexpr int kThreads = 16, kSteps = 300;
  std::vector<BatchNormModel> before;
  {
    Opened o = Open(dir, /*snapshot_log_bytes=*/64 << 10);
    o.state->SetObserver(&observer);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(100 + t);
        for (int i = 0; i < kSteps; ++i) {
          const std::string name = "model" + std::to_string(t % 4);
          EXPECT_TRUE(o.store->Train(name, RandomBatch(rng, 8)).ok());
        }
      });
    }
    for (auto& t : threads) t.join();
    before = o.store->List(true);
    o.state->SetObserver(nullptr);
  }
  // Every step, plus the creation of the 4 models.
  EXPECT_EQ(observer.records.load(), kThreads * kSteps + 4);
  // Group commit: far fewer syncs than records.
  EXPECT_LT(observer.syncs.load(), observer.records.load());
  EXPECT_GT(observer.snapshots.load(), 0);
  EXPECT_EQ(observer.failures.load(), 0);
  int64_t batches = 0;
  for (const auto& m : before) batches += m.generation - 1;
  EXPECT_EQ(batches, kThreads * kSteps);
  Opened o = Open(dir);
  ExpectSameModels(before, o.store->List(true));
}

// Train, Delete, Reset, Put and Merge racing on the same two names: the log
// must hold them in the order each name saw them (a Delete can reach a model
// that a concurrent Train has just created, before the step is applied).
TEST(DurableStateTest, RacingChangesOfOneNameReplayInTheirOrder) {
  const std::string dir = FreshDir("racing");
  std::vector<BatchNormModel> before;
  {
    Opened o = Open(dir);
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        std::mt19937_64 rng(200 + t);
        for (int i = 0; i < 2000; ++i) {
          const std::string name = (rng() & 1) ? "x" : "y";
          switch (rng() % 6) {
            case 0:
              (void)o.store->Delete(name);
              break;
            case 1:
              (void)o.store->Reset(name);
              break;
            case 2:
              (void)o.store->Put(RandomModel(rng, name, 2),
                                 /*create_only=*/false);
              break;
            case 3:
              MergeSibling(*o.store, name, name == "x" ? "y" : "x");
              break;
            default:
              EXPECT_TRUE(o.store->Train(name, RandomBatch(rng, 2)).ok());
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    before = o.store->List(true);
  }
  Opened o = Open(dir);
  ExpectSameModels(before, o.store->List(true));
}

TEST(DurableStateTest, TornLastRecordIsDroppedWithAWarning) {
  const std::string dir = FreshDir("torn");
  std::vector<BatchNormModel> before;
  {
    Opened o = Open(dir);
    RandomChanges(*o.store, 50, 4);
    before = o.store->List(true);
    ASSERT_TRUE(
        o.store->Train("m1", std::vector<Moments>(2, {3, 1.0, 2.0})).ok());
  }
  // Cut the last record (the Train above) in half.
  const std::string segment = FilesIn(dir, "wal-").back();
  fs::resize_file(segment, fs::file_size(segment) - 20);
  Opened o = Open(dir);
  ASSERT_EQ(o.report.warnings.size(), 1u);
  EXPECT_NE(o.report.warnings[0].find("torn record"), std::string::npos);
  EXPECT_NE(o.report.warnings[0].find(segment), std::string::npos);
  ExpectSameModels(before, o.store->List(true));
}

TEST(DurableStateTest, CorruptRecordInTheMiddleStopsRecovery) {
  const std::string dir = FreshDir("corrupt_log");
  {
    Opened o = Open(dir);
    RandomChanges(*o.store, 50, 5);
  }
  const std::string segment = FilesIn(dir, "wal-").back();
  {
    std::fstream f(segment, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x5a');
  }
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(segment), std::string::npos) << s;
  // Nothing was changed: the same error again.
  EXPECT_EQ(OpenStatus(dir).code(), absl::StatusCode::kDataLoss);
}

TEST(DurableStateTest, CorruptSnapshotStopsRecovery) {
  const std::string dir = FreshDir("corrupt_snapshot");
  {
    Opened o = Open(dir);
    RandomChanges(*o.store, 50, 6);
    ASSERT_TRUE(o.state->Close().ok());
  }
  const std::string snapshot = FilesIn(dir, "snapshot-").back();
  {
    std::fstream f(snapshot, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x01');
  }
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(snapshot), std::string::npos) << s;
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s;
}

// The log segment format (durable_state.cc): a 24-byte header (magic,
// version, first record number, CRC), then records of a 16-byte header
// (length, CRC, record number) and `length` bytes; zeros end the log.
constexpr size_t kSegmentHeaderBytes = 24;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// [begin, end) of each record of a segment's bytes.
std::vector<std::pair<size_t, size_t>> RecordSpans(const std::string& bytes) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t at = kSegmentHeaderBytes;
  uint32_t length = 0;
  while (
      at + 16 <= bytes.size() &&
      state::ByteReader(absl::string_view(bytes).substr(at)).GetU32(&length) &&
      length != 0) {
    spans.emplace_back(at, at + 16 + length);
    at += 16 + length;
  }
  return spans;
}

// A session's log: records #1..#n in wal-1 (not closed, so no later
// snapshot covers them), and the models they leave.
std::vector<BatchNormModel> LogOnlySession(const std::string& dir, int steps,
                                           uint32_t seed) {
  Opened o = Open(dir);
  RandomChanges(*o.store, steps, seed);
  return o.store->List(true);
}

TEST(DurableStateTest, DamagedManifestStopsStartUpNamingIt) {
  const std::string dir = FreshDir("damaged_manifest");
  LogOnlySession(dir, 30, 7);
  const std::string manifest = dir + "/MANIFEST";
  std::string text = ReadAll(manifest);
  ASSERT_GT(text.size(), 30u);
  text[25] ^= 0x01;  // Inside "snapshot <number>": the checksum fails.
  WriteAll(manifest, text);
  for (int attempt = 0; attempt < 2; ++attempt) {  // Nothing was changed.
    const absl::Status s = OpenStatus(dir);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(manifest), std::string::npos) << s;
  }
}

TEST(DurableStateTest, RecordsOutOfSequenceInASegmentStopRecovery) {
  const std::string dir = FreshDir("out_of_sequence");
  LogOnlySession(dir, 30, 8);
  const std::string segment = FilesIn(dir, "wal-").back();
  std::string bytes = ReadAll(segment);
  const auto spans = RecordSpans(bytes);
  ASSERT_GE(spans.size(), 2u);
  // Records #1 and #2 swapped: each whole, with a valid checksum.
  const std::string first =
      bytes.substr(spans[0].first, spans[0].second - spans[0].first);
  const std::string second =
      bytes.substr(spans[1].first, spans[1].second - spans[1].first);
  bytes.replace(spans[0].first, spans[1].second - spans[0].first,
                second + first);
  WriteAll(segment, bytes);
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(segment), std::string::npos) << s;
  EXPECT_NE(s.message().find("offset 24 is #2, expected #1"), std::string::npos)
      << s;
}

TEST(DurableStateTest, IncompleteRecordFollowedByANewerSegmentStopsRecovery) {
  const std::string dir = FreshDir("incomplete_then_newer");
  LogOnlySession(dir, 30, 9);
  const std::string segment = FilesIn(dir, "wal-").back();
  const std::string bytes = ReadAll(segment);
  const auto spans = RecordSpans(bytes);
  ASSERT_GE(spans.size(), 4u);
  // wal-1 keeps records #1 and #2 and half of #3; the rest, from #3 on, go
  // to a newer segment with a valid header: #3 is cut short, yet the log
  // goes on, so it is damage, not a write cut off by a crash.
  const size_t cut = spans[2].first + (spans[2].second - spans[2].first) / 2;
  WriteAll(segment, bytes.substr(0, cut));
  std::string header = bytes.substr(0, 12);  // Magic and version.
  for (int i = 0; i < 8; ++i) header.push_back(i == 0 ? 3 : 0);  // First #3.
  const uint32_t crc = state::Crc32(header);
  for (int i = 0; i < 4; ++i)
    header.push_back(static_cast<char>(crc >> (8 * i)));
  WriteAll(dir + "/" + state::SegmentFileName(3),
           header + bytes.substr(spans[2].first,
                                 spans.back().second - spans[2].first));
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(segment), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("record at offset ", spans[2].first,
                                          " is truncated, and a newer "
                                          "segment follows")),
            std::string::npos)
      << s;
}

TEST(DurableStateTest, NewestSegmentWithoutAWholeHeaderIsDroppedWithAWarning) {
  const std::string dir = FreshDir("headerless_segment");
  const std::vector<BatchNormModel> before = LogOnlySession(dir, 30, 10);
  const auto spans = RecordSpans(ReadAll(FilesIn(dir, "wal-").back()));
  // A crash right after the next segment was created, before its header
  // was synced: 10 bytes of it.
  const std::string newest =
      dir + "/" + state::SegmentFileName(spans.size() + 1);
  WriteAll(newest, std::string("NORMDWAL\x01\x00", 10));
  Opened o = Open(dir);
  ASSERT_NE(o.state, nullptr);
  ASSERT_EQ(o.report.warnings.size(), 1u);
  EXPECT_NE(o.report.warnings[0].find(newest), std::string::npos);
  EXPECT_NE(o.report.warnings[0].find("header was never completely written"),
            std::string::npos)
      << o.report.warnings[0];
  ExpectSameModels(before, o.store->List(true));
}

TEST(DurableStateTest, ADirectoryServesOneServerAtATime) {
  const std::string dir = FreshDir("lock");
  Opened first = Open(dir);
  const absl::Status s = OpenStatus(dir);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("in use"), std::string::npos) << s;
}

// A full disk: the next log segment is /dev/full, so its writes fail with
// ENOSPC. From then on every change is refused with UNAVAILABLE and leaves
// the store as it was; what was acknowledged before is recovered.
TEST(DurableStateTest, FullDiskRefusesChangesAndKeepsWhatWasAcknowledged) {
  const std::string dir = FreshDir("full");
  std::vector<BatchNormModel> acknowledged;
  CountingObserver observer;
  {
    Opened o = Open(dir);
    o.state->SetObserver(&observer);
    ASSERT_TRUE(
        o.store->Train("a", std::vector<Moments>(2, {3, 1.0, 2.0})).ok());
    acknowledged = o.store->List(true);
    // The next segment starts after the 2 records so far (create + step).
    const std::string next = dir + "/" + SegmentFileName(3);
    fs::create_symlink("/dev/full", next);
    const absl::Status snapshot = o.state->Snapshot();
    EXPECT_EQ(snapshot.code(), absl::StatusCode::kUnavailable) << snapshot;
    const auto refused =
        o.store->Train("a", std::vector<Moments>(2, {3, 5.0, 2.0}));
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(refused.status().message().find("durable"), std::string::npos)
        << refused.status();
    EXPECT_EQ(o.store->Delete("a").code(), absl::StatusCode::kUnavailable);
    ExpectSameModels(acknowledged, o.store->List(true));  // Unchanged.
    EXPECT_EQ(observer.failures.load(), 1);               // Told once.
    o.state->SetObserver(nullptr);
    fs::remove(next);
  }
  Opened o = Open(dir);
  ExpectSameModels(acknowledged, o.store->List(true));
}

// A rotation writes and syncs the records still queued before it starts the
// next segment. If only the new segment fails, those records are durable and
// their callers are acknowledged; the failure refuses what comes after.
TEST(DurableStateTest, RecordsFlushedBeforeAFailedRotationAreAcknowledged) {
  const std::string dir = FreshDir("rotation");
  std::vector<BatchNormModel> acknowledged;
  {
    Opened o = Open(dir);
    uint64_t sequence = 0;
    {
      DeferDurability defer;
      ASSERT_TRUE(
          o.store->Train("a", std::vector<Moments>(2, {3, 1.0, 2.0})).ok());
      sequence = defer.sequence();
    }
    ASSERT_EQ(sequence, 2u);  // Create + step; the rotation cuts after 2.
    acknowledged = o.store->List(true);
    const std::string next = dir + "/" + SegmentFileName(3);
    fs::create_symlink("/dev/full", next);
    EXPECT_EQ(o.state->Snapshot().code(), absl::StatusCode::kUnavailable);
    absl::Notification answered;
    absl::Status outcome = absl::UnknownError("not answered");
    o.store->OnDurable(sequence, [&](absl::Status s) {
      outcome = s;
      answered.Notify();
    });
    answered.WaitForNotification();
    EXPECT_TRUE(outcome.ok()) << outcome;
    EXPECT_EQ(o.state->Healthy().code(), absl::StatusCode::kUnavailable);
    fs::remove(next);
  }
  Opened o = Open(dir);
  ExpectSameModels(acknowledged, o.store->List(true));
}

TEST(DurableStateTest, ClosedStateRefusesChanges) {
  const std::string dir = FreshDir("closed");
  Opened o = Open(dir);
  ASSERT_TRUE(o.store->Train("a", std::vector<Moments>(1, {2, 0.0, 1.0})).ok());
  ASSERT_TRUE(o.state->Close().ok());
  const auto after =
      o.store->Train("a", std::vector<Moments>(1, {2, 0.0, 1.0}));
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(o.store->Get("a")->num_batches_tracked, 1);  // Unchanged.
}

// The engine under concurrent mixed load with durable state, in process (so
// that ThreadSanitizer sees every thread: `make test-tsan`): Fit, training and
// eval Normalize on 4 models, Reset and Delete of others. Nothing acknowledged
// is lost or doubled, generations are exactly 2..n+1, pooled statistics match
// fp64 over every value, and reopening recovers the same models.
constexpr int kMixedModels = 4;
constexpr int64_t kMixedRows = 4, kMixedChannels = 3;
using AppliedBatches =
    std::map<std::string, std::map<uint64_t, std::vector<double>>>;

// A thread's operation i on `model` with `batch`: Fit (4 in 10), training
// Normalize (2), eval Normalize, and Reset, Delete or Fit of "other". The
// model after an update of `model`, nullopt after any other operation;
// `failures` counts what failed that should not have.
std::optional<absl::StatusOr<BatchNormModel>> MixedEngineOperation(
    Engine& engine, const std::string& model, int i, std::vector<double>& batch,
    std::atomic<int>& failures) {
  InputTensor input{DType::kFloat64,
                    {kMixedRows, kMixedChannels},
                    batch.data(),
                    kMixedRows * kMixedChannels,
                    nullptr};
  NormalizeSpec spec;
  spec.mode = NormMode::kBatchNorm;
  spec.model = model;
  spec.input = input;
  std::vector<double> out(batch.size());
  switch (i % 10) {
    case 6: {  // Eval.
      auto r = engine.Normalize(spec, out.data());
      if (!r.ok() && r.status().code() != absl::StatusCode::kNotFound) {
        ++failures;
      }
      return std::nullopt;
    }
    case 7:
      (void)engine.store().Reset("other");
      return std::nullopt;
    case 8:
      (void)engine.store().Delete("other");
      return std::nullopt;
    case 9:
      if (!engine.Fit({"other", input, std::nullopt}).ok()) ++failures;
      return std::nullopt;
    case 4:
    case 5: {  // Training.
      spec.training = true;
      auto r = engine.Normalize(spec, out.data());
      if (!r.ok()) return absl::StatusOr<BatchNormModel>(r.status());
      return absl::StatusOr<BatchNormModel>(**r);
    }
    default:
      return engine.Fit({model, input, std::nullopt});
  }
}

// Each model's counter and generations against the batches acknowledged
// for it, and its pooled statistics against fp64 over them.
void ExpectModelsMatchTheirBatches(const ModelStore& store,
                                   AppliedBatches& applied) {
  for (int k = 0; k < kMixedModels; ++k) {
    const std::string name = "m" + std::to_string(k);
    SCOPED_TRACE(name);
    const auto& by_generation = applied[name];
    auto model = store.Get(name);
    ASSERT_TRUE(model.ok());
    ASSERT_FALSE(by_generation.empty());
    EXPECT_EQ(model->num_batches_tracked,
              static_cast<int64_t>(by_generation.size()));
    EXPECT_EQ(by_generation.begin()->first, 2u);
    EXPECT_EQ(by_generation.rbegin()->first, by_generation.size() + 1);
    std::vector<double> all;
    for (const auto& [g, b] : by_generation) {
      all.insert(all.end(), b.begin(), b.end());
    }
    const auto pooled = testing::ReferenceChannelStats(
        all, static_cast<int64_t>(all.size()) / kMixedChannels, kMixedChannels,
        1);
    for (int c = 0; c < kMixedChannels; ++c) {
      EXPECT_LE(testing::RelErr(model->PooledMean()[c], pooled.mean[c]), 1e-12);
      EXPECT_LE(testing::RelErr(model->PooledVariance()[c], pooled.var[c]),
                1e-12);
    }
  }
}

TEST(EngineConcurrencyTest, MixedThreadsLoseNothingAndRecoverExactly) {
  const std::string dir = FreshDir("engine");
  constexpr int kThreads = 16, kOps = 300;
  std::mutex mu;
  AppliedBatches applied;
  std::atomic<int> failures = 0;
  std::vector<BatchNormModel> before;
  {
    Engine engine;
    RecoveryReport report;
    auto state = DurableState::Open({dir, 16 << 10}, engine.store(), &report);
    ASSERT_TRUE(state.ok()) << state.status();
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < kOps; ++i) {
          const std::string model =
              "m" + std::to_string((t + i) % kMixedModels);
          std::vector<double> batch = testing::RandomValues<double>(
              kMixedRows * kMixedChannels, 1000 * t + i, 50.0 * t, 1.0 + i % 3);
          const auto after =
              MixedEngineOperation(engine, model, i, batch, failures);
          if (!after.has_value()) continue;
          if (!after->ok()) {
            ++failures;
            continue;
          }
          std::lock_guard<std::mutex> lock(mu);
          if (!applied[model].emplace((*after)->generation, batch).second) {
            ++failures;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(failures, 0);
    ExpectModelsMatchTheirBatches(engine.store(), applied);
    before = engine.store().List(true);
  }
  Opened o = Open(dir);
  ExpectSameModels(before, o.store->List(true));
}

// Drift observation under racing threads (TSan runs this program): eight
// threads evaluate one model with a reference while others read its drift,
// list every model and re-set its reference; every observed value is in the
// window at the end, and the window's mean is the inputs'.
TEST(EngineConcurrencyTest, RacingObservationsOfOneModelLoseNothing) {
  Engine engine({}, kDefaultMaxRank, {.min_samples = 1});
  ASSERT_TRUE(engine.store().Create({.name = "d", .num_features = 2}).ok());
  ASSERT_TRUE(engine.store()
                  .SetReference("d", {.source = ReferenceSource::kRunning})
                  .ok());
  constexpr int kEvaluators = 8, kCalls = 50, kRows = 16;
  std::atomic<int> failures = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kEvaluators; ++t) {
    threads.emplace_back([&, t] {
      // Channel 0 holds t, channel 1 holds -t.
      std::vector<double> x(2 * kRows);
      for (int r = 0; r < kRows; ++r) {
        x[2 * r] = t;
        x[2 * r + 1] = -t;
      }
      std::vector<double> y(x.size());
      NormalizeSpec spec{.mode = NormMode::kBatchNorm,
                         .model = "d",
                         .input = {.dtype = DType::kFloat64,
                                   .shape = {kRows, 2},
                                   .data = x.data(),
                                   .size = 2 * kRows}};
      for (int i = 0; i < kCalls; ++i) {
        if (!engine.Normalize(spec, y.data()).ok()) ++failures;
      }
    });
  }
  threads.emplace_back([&] {
    for (int i = 0; i < kCalls; ++i) {
      absl::StatusOr<BatchNormModel> model = engine.store().Get("d");
      if (!model.ok() || !engine.Drift(*model).has_value()) ++failures;
      (void)engine.store().List();
    }
  });
  threads.emplace_back([&] {
    for (int i = 0; i < kCalls; ++i) {
      if (!engine.store()
               .SetReference("d", {.source = ReferenceSource::kRunning})
               .ok()) {
        ++failures;
      }
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  const std::vector<Moments> window = engine.drift_monitor().Window("d", 2);
  EXPECT_EQ(window[0].count, kEvaluators * kCalls * kRows);
  // The mean of t over the evaluators, 3.5; exact in any merge order up to
  // rounding.
  EXPECT_NEAR(window[0].mean, 3.5, 1e-12);
  EXPECT_NEAR(window[1].mean, -3.5, 1e-12);
}

// Every truncation of `bytes` (a record) fails cleanly, and so does a
// record of `kind` declaring 2^60 entries: refused before allocating.
void ExpectTruncationsAndHugeCountsFail(const std::string& bytes,
                                        Mutation::Kind kind,
                                        absl::string_view name) {
  MutationRecord record;
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_FALSE(DecodeMutation(bytes.substr(0, n), &record).ok()) << n;
  }
  std::string huge;
  ByteWriter(huge).PutU8(static_cast<uint8_t>(kind));
  ByteWriter(huge).PutString(name);
  ByteWriter(huge).PutU64(uint64_t{1} << 60);
  EXPECT_FALSE(DecodeMutation(huge, &record).ok());
}

TEST(CodecTest, DecodingGarbageNeverSucceedsByAccident) {
  BatchNormModel model = MakeDefaultModel("x", 3);
  std::string bytes;
  ByteWriter writer(bytes);
  Mutation create{.kind = Mutation::Kind::kCreate,
                  .name = "x",
                  .model = &model,
                  .batch = {}};
  EncodeMutation(create, writer);
  MutationRecord record;
  ASSERT_TRUE(DecodeMutation(bytes, &record).ok());
  EXPECT_EQ(record.model.num_features, 3);
  ExpectTruncationsAndHugeCountsFail(bytes, Mutation::Kind::kTrain, "x");
}

// Models encoded before drift references (format 1) decode as they were:
// format 2 adds one byte, zero for a model without a reference.
TEST(CodecTest, FormatOneModelsDecodeWithoutAReference) {
  std::mt19937_64 rng(3);
  BatchNormModel model = RandomModel(rng, "old", 3);
  model.reference.reset();
  std::string bytes;
  ByteWriter writer(bytes);
  EncodeModel(model, writer);
  ASSERT_EQ(bytes.back(), '\0');
  const std::string format_one = bytes.substr(0, bytes.size() - 1);
  BatchNormModel decoded;
  ByteReader reader(format_one);
  ASSERT_TRUE(DecodeModel(reader, &decoded, /*version=*/1).ok());
  EXPECT_EQ(reader.remaining(), 0u);
  ExpectSameModels({model}, {decoded});
  // Read as format 2, the same bytes end early.
  ByteReader as_two(format_one);
  EXPECT_FALSE(DecodeModel(as_two, &decoded, /*version=*/2).ok());
}

// A model's reference survives encoding bit for bit; a damaged one (a
// negative variance, an unknown source) is refused.
TEST(CodecTest, ReferencesRoundTripAndDamageIsRefused) {
  BatchNormModel model = MakeDefaultModel("r", 2);
  model.reference = DriftReference{.source = ReferenceSource::kCheckpoint,
                                   .set_unix_nanos = 1234567890123,
                                   .mean = {0.1, -0.2},
                                   .var = {3.5, 0}};
  std::string bytes;
  ByteWriter writer(bytes);
  EncodeModel(model, writer);
  BatchNormModel decoded;
  ByteReader reader(bytes);
  ASSERT_TRUE(DecodeModel(reader, &decoded).ok());
  ExpectSameModels({model}, {decoded});
  for (size_t n = 0; n < bytes.size(); ++n) {
    ByteReader cut(absl::string_view(bytes).substr(0, n));
    EXPECT_FALSE(DecodeModel(cut, &decoded).ok()) << n;
  }
  for (auto damage : {+[](BatchNormModel& m) { m.reference->var[1] = -1; },
                      +[](BatchNormModel& m) {
                        m.reference->source = static_cast<ReferenceSource>(9);
                      }}) {
    BatchNormModel damaged = model;
    damage(damaged);
    std::string damaged_bytes;
    ByteWriter damaged_writer(damaged_bytes);
    EncodeModel(damaged, damaged_writer);
    ByteReader damaged_reader(damaged_bytes);
    EXPECT_FALSE(DecodeModel(damaged_reader, &decoded).ok());
  }
}

// A record that creates several models decodes to exactly them, and any
// damage fails cleanly: a truncation, a count past the record, a name twice.
TEST(CodecTest, CreateAllRecordsRoundTripAndRefuseDamage) {
  const auto encoded = [](const std::vector<BatchNormModel>& models) {
    std::string bytes;
    ByteWriter writer(bytes);
    EncodeMutation({.kind = Mutation::Kind::kCreateAll,
                    .name = {},
                    .model = nullptr,
                    .batch = {},
                    .running_targets = {},
                    .models = models},
                   writer);
    return bytes;
  };
  std::vector<BatchNormModel> models = {MakeDefaultModel("a.bn1", 3),
                                        MakeDefaultModel("a.bn2", 1)};
  models[1].running_var = {0.5};
  const std::string bytes = encoded(models);
  MutationRecord record;
  ASSERT_TRUE(DecodeMutation(bytes, &record).ok());
  EXPECT_EQ(record.kind, Mutation::Kind::kCreateAll);
  ExpectSameModels(models, record.models);
  ExpectTruncationsAndHugeCountsFail(bytes, Mutation::Kind::kCreateAll, "");
  models[1].name = "a.bn1";
  const absl::Status status = DecodeMutation(encoded(models), &record);
  EXPECT_NE(status.message().find("twice"), std::string::npos) << status;
}

// Models created together come back together: all of them after a crash,
// none of them if their record was torn.
TEST(DurableStateTest, ModelsCreatedTogetherRecoverAllOrNone) {
  const std::string dir = FreshDir("create_all");
  std::vector<BatchNormModel> before;
  const std::vector<ModelSpec> specs = {
      {.name = "net.bn1", .num_features = 4, .running_mean = {1, 2, 3, 4}},
      {.name = "net.bn2", .num_features = 2, .num_batches_tracked = 9}};
  {
    Opened o = Open(dir);
    ASSERT_TRUE(o.store->Create({.name = "other", .num_features = 1}).ok());
    before = o.store->List(true);
    ASSERT_TRUE(o.store->CreateAll(specs).ok());
  }
  {
    Opened o = Open(dir);
    ASSERT_EQ(o.store->size(), 3);
    EXPECT_EQ(o.store->Get("net.bn1")->running_mean,
              (std::vector<double>{1, 2, 3, 4}));
    EXPECT_EQ(o.store->Get("net.bn2")->num_batches_tracked, 9);
    ASSERT_TRUE(o.store->Delete("net.bn1").ok());
    ASSERT_TRUE(o.store->Delete("net.bn2").ok());
    ASSERT_TRUE(o.store->CreateAll(specs).ok());
  }
  // Cut the last record (the second CreateAll) short.
  const std::string segment = FilesIn(dir, "wal-").back();
  fs::resize_file(segment, fs::file_size(segment) - 30);
  Opened o = Open(dir);
  ASSERT_EQ(o.report.warnings.size(), 1u);
  ExpectSameModels(before, o.store->List(true));
}

// The layout is little-endian whatever the host, and a combined checksum is
// the checksum of the concatenation (hand-worked bytes; zlib's crc32 of the
// whole as the reference).
TEST(CodecTest, BytesAreLittleEndianAndChecksumsCombine) {
  std::string bytes;
  ByteWriter writer(bytes);
  writer.PutU32(0x01020304u);
  writer.PutU64(0x1122334455667788ull);
  EXPECT_EQ(bytes, std::string("\x04\x03\x02\x01\x88\x77\x66\x55\x44\x33"
                               "\x22\x11",
                               12));
  EXPECT_EQ(Crc32("123456789"), 0xCBF43926u);  // The standard check value.
  const std::string a = "sequence", b(1500, 'p');
  EXPECT_EQ(Crc32Combine(Crc32(a), Crc32(b), b.size()), Crc32(a + b));
  EXPECT_EQ(Crc32Combine(Crc32(a), Crc32(""), 0), Crc32(a));
}

}  // namespace
}  // namespace normd::state

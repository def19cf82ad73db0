#include "server/state/durable_state.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/state/codec.h"

namespace normd::state {
namespace {

constexpr char kSnapshotMagic[] = "NORMDSNP";
constexpr char kSegmentMagic[] = "NORMDWAL";
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kMagicSize = 8;
constexpr size_t kSegmentHeaderSize = kMagicSize + 4 + 8 + 4;
constexpr size_t kRecordHeaderSize = 4 + 4 + 8;  // length, crc, sequence.
constexpr char kSnapshotTemp[] = "snapshot.tmp";

std::string Join(const std::string& dir, const std::string& name) {
  return absl::StrCat(dir, "/", name);
}

absl::Status IoError(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

absl::Status DataLoss(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      path, ": ", what,
      "; refusing to start (nothing was changed: restore the file from a "
      "backup, or move the state directory away to start empty)"));
}

absl::Status WriteAll(int fd, absl::string_view bytes,
                      const std::string& path) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError("cannot write", path);
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Writes `bytes` to `fd` and makes them durable (fdatasync).
absl::Status WriteAndSync(int fd, absl::string_view bytes,
                          const std::string& path) {
  absl::Status s = WriteAll(fd, bytes, path);
  if (s.ok() && ::fdatasync(fd) != 0) s = IoError("cannot sync", path);
  return s;
}

// The sticky error every later change gets once writing the log failed.
absl::Status RefusalError(const absl::Status& cause) {
  return absl::UnavailableError(
      absl::StrCat("state_dir: changes can no longer be made durable, so "
                   "they are refused: ",
                   cause.message()));
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open", path);
  struct stat info;
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": not a regular file; refusing to start"));
  }
  std::string bytes;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = IoError("cannot read", path);
      ::close(fd);
      return s;
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return bytes;
}

absl::Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("cannot open directory", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : IoError("cannot sync directory", dir);
}

// "<prefix><20 digits><suffix>" -> the number.
bool ParseNumbered(absl::string_view name, absl::string_view prefix,
                   absl::string_view suffix, uint64_t* number) {
  if (name.size() != prefix.size() + 20 + suffix.size() ||
      name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return false;
  }
  *number = 0;
  for (char c : name.substr(prefix.size(), 20)) {
    if (c < '0' || c > '9') return false;
    *number = *number * 10 + static_cast<uint64_t>(c - '0');
  }
  return true;
}

struct DirectoryListing {
  std::vector<uint64_t> snapshots;  // Sorted.
  std::vector<uint64_t> segments;   // Sorted by first sequence.
};

absl::StatusOr<DirectoryListing> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return IoError("cannot list", dir);
  DirectoryListing listing;
  while (const dirent* e = ::readdir(d)) {
    uint64_t n;
    if (ParseNumbered(e->d_name, "snapshot-", ".snap", &n)) {
      listing.snapshots.push_back(n);
    } else if (ParseNumbered(e->d_name, "wal-", ".log", &n)) {
      listing.segments.push_back(n);
    }
  }
  ::closedir(d);
  std::sort(listing.snapshots.begin(), listing.snapshots.end());
  std::sort(listing.segments.begin(), listing.segments.end());
  return listing;
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// Replays one decoded record into the store (which has no log attached).
absl::Status ApplyRecord(ModelStore& store, const MutationRecord& record) {
  switch (record.kind) {
    case Mutation::Kind::kCreate:
    case Mutation::Kind::kPut:
      store.Restore(record.model);
      return absl::OkStatus();
    case Mutation::Kind::kTrain:
    case Mutation::Kind::kTrainInstance:
      // Created with defaults when absent, as the live step did (here
      // without the model-count limit, which applied when it was logged).
      if (!store.Get(record.name).ok()) {
        store.Restore(MakeDefaultModel(
            record.name, static_cast<int64_t>(record.batch.size())));
      }
      if (record.kind == Mutation::Kind::kTrainInstance) {
        return store
            .TrainInstance(record.name, record.batch, record.running_targets)
            .status();
      }
      return store.Train(record.name, record.batch).status();
    case Mutation::Kind::kDelete:
      return store.Delete(record.name);
    case Mutation::Kind::kReset:
      return store.Reset(record.name).status();
  }
  return absl::InternalError("unknown record kind");
}

}  // namespace

std::string SnapshotFileName(uint64_t sequence) {
  return absl::StrFormat("snapshot-%020d.snap", sequence);
}

std::string SegmentFileName(uint64_t first_sequence) {
  return absl::StrFormat("wal-%020d.log", first_sequence);
}

DurableState::DurableState(const DurableStateOptions& options,
                           ModelStore& store, int lock_fd)
    : options_(options), store_(store), lock_fd_(lock_fd) {}

absl::StatusOr<std::unique_ptr<DurableState>> DurableState::Open(
    const DurableStateOptions& options, ModelStore& store,
    RecoveryReport* report) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("--state_dir: must not be empty");
  }
  if (::mkdir(options.dir.c_str(), 0750) != 0 && errno != EEXIST) {
    return IoError("--state_dir: cannot create", options.dir);
  }
  const std::string lock_path = Join(options.dir, "LOCK");
  const int lock_fd =
      ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0640);
  if (lock_fd < 0) return IoError("--state_dir: cannot open", lock_path);
  if (::flock(lock_fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(lock_fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir: ", options.dir, " is in use by another normd (",
        lock_path, " is locked)"));
  }
  std::unique_ptr<DurableState> state(
      new DurableState(options, store, lock_fd));
  if (absl::Status s = state->Recover(report); !s.ok()) return s;
  store.SetMutationLog(state.get());
  state->sync_thread_ = std::thread([s = state.get()] { s->SyncLoop(); });
  state->snapshot_thread_ =
      std::thread([s = state.get()] { s->SnapshotLoop(); });
  return state;
}

DurableState::~DurableState() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  if (sync_thread_.joinable()) sync_thread_.join();  // After a last sync.
  store_.SetMutationLog(nullptr);
  MutexLock lock(&mu_);
  if (segment_fd_ >= 0) ::close(segment_fd_);
  ::close(lock_fd_);  // Releases the flock.
}

absl::Status DurableState::Recover(RecoveryReport* report) {
  ::unlink(Join(options_.dir, kSnapshotTemp).c_str());
  absl::StatusOr<DirectoryListing> listing = ListDirectory(options_.dir);
  if (!listing.ok()) return listing.status();

  uint64_t snapshot_sequence = 0;
  if (!listing->snapshots.empty()) {
    snapshot_sequence = listing->snapshots.back();
    const std::string path =
        Join(options_.dir, SnapshotFileName(snapshot_sequence));
    absl::StatusOr<std::string> bytes = ReadFile(path);
    if (!bytes.ok()) return bytes.status();
    if (bytes->size() < kMagicSize + 4 + 8 + 8 + 4 ||
        bytes->compare(0, kMagicSize, kSnapshotMagic) != 0) {
      return DataLoss(path, "not a normd snapshot (bad header)");
    }
    const absl::string_view body(bytes->data(), bytes->size() - 4);
    ByteReader crc_reader(absl::string_view(*bytes).substr(body.size()));
    uint32_t stored_crc = 0;
    crc_reader.GetU32(&stored_crc);
    if (Crc32(body) != stored_crc) {
      return DataLoss(path, "checksum mismatch (the snapshot is corrupt)");
    }
    ByteReader in(body.substr(kMagicSize));
    uint32_t version = 0;
    uint64_t sequence = 0, count = 0;
    if (!in.GetU32(&version) || version != kFormatVersion ||
        !in.GetU64(&sequence) || sequence != snapshot_sequence ||
        !in.GetU64(&count)) {
      return DataLoss(path, "unsupported version or wrong sequence number");
    }
    for (uint64_t i = 0; i < count; ++i) {
      BatchNormModel model;
      if (!DecodeModel(in, &model)) {
        return DataLoss(path, absl::StrCat("model ", i, " is malformed"));
      }
      store_.Restore(std::move(model));
    }
    if (in.remaining() != 0) return DataLoss(path, "trailing bytes");
    report->snapshot_file = path;
  }

  uint64_t next_sequence = snapshot_sequence + 1;
  for (size_t i = 0; i < listing->segments.size(); ++i) {
    const bool last = i + 1 == listing->segments.size();
    // A segment that ends before the snapshot is already covered by it.
    if (!last && listing->segments[i + 1] <= snapshot_sequence + 1) continue;
    const std::string path =
        Join(options_.dir, SegmentFileName(listing->segments[i]));
    if (absl::Status s = ReplaySegment(path, last, &next_sequence, report);
        !s.ok()) {
      return s;
    }
  }
  report->models = store_.size();

  // A fresh snapshot of the recovered state, then a new, empty log.
  const uint64_t last_sequence = next_sequence - 1;
  if (report->records_replayed > 0 || listing->snapshots.empty() ||
      listing->snapshots.back() != last_sequence) {
    int64_t bytes = 0;
    if (absl::Status s = WriteSnapshotFile(store_.List(/*with_arrays=*/true),
                                           last_sequence, &bytes);
        !s.ok()) {
      return s;
    }
  }
  DropFilesBefore(last_sequence + 1);
  MutexLock lock(&mu_);
  next_sequence_ = next_sequence;
  durable_sequence_ = last_sequence;
  return StartSegment(next_sequence);
}

absl::Status DurableState::ReplaySegment(const std::string& path, bool last,
                                         uint64_t* next_sequence,
                                         RecoveryReport* report) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  const absl::string_view file(*bytes);
  if (file.size() < kSegmentHeaderSize) {
    if (last) {
      report->warnings.push_back(absl::StrCat(
          path, ": dropped a torn segment header (", file.size(), " bytes)"));
      return absl::OkStatus();
    }
    return DataLoss(path, "truncated segment header");
  }
  ByteReader header(file.substr(0, kSegmentHeaderSize));
  uint32_t version = 0, header_crc = 0;
  uint64_t first = 0;
  header.GetU64(&first);  // The magic, checked below.
  header.GetU32(&version);
  header.GetU64(&first);
  header.GetU32(&header_crc);
  if (file.substr(0, kMagicSize) != kSegmentMagic ||
      Crc32(file.substr(0, kSegmentHeaderSize - 4)) != header_crc ||
      version != kFormatVersion) {
    return DataLoss(path, "not a normd log segment (bad header)");
  }
  if (first > *next_sequence) {
    return DataLoss(
        path, absl::StrCat("starts at record ", first,
                           " but the state ends at record ", *next_sequence - 1,
                           " (a segment is missing)"));
  }
  size_t offset = kSegmentHeaderSize;
  uint64_t expected = first;
  while (offset < file.size()) {
    const size_t left = file.size() - offset;
    ByteReader frame(file.substr(offset));
    uint32_t length = 0, crc = 0;
    uint64_t sequence = 0;
    const bool complete = left >= kRecordHeaderSize && frame.GetU32(&length) &&
                          frame.GetU32(&crc) && frame.GetU64(&sequence) &&
                          length <= left - kRecordHeaderSize;
    const bool ends_file =
        complete && offset + kRecordHeaderSize + length == file.size();
    const absl::string_view checked =
        complete ? file.substr(offset + 8, 8 + length) : absl::string_view();
    if (!complete || Crc32(checked) != crc) {
      if (last && (!complete || ends_file)) {
        report->warnings.push_back(absl::StrCat(
            path, ": dropped a torn record at offset ", offset, " (", left,
            " bytes): its write was cut off, so it was never acknowledged"));
        return absl::OkStatus();
      }
      return DataLoss(path, absl::StrCat("record at offset ", offset,
                                         complete ? " fails its checksum"
                                                  : " is truncated"));
    }
    if (sequence != expected) {
      return DataLoss(path, absl::StrCat("record at offset ", offset, " is #",
                                         sequence, ", expected #", expected));
    }
    if (sequence >= *next_sequence) {
      MutationRecord record;
      if (!DecodeMutation(checked.substr(8), &record)) {
        return DataLoss(path, absl::StrCat("record #", sequence, " at offset ",
                                           offset, " is malformed"));
      }
      if (absl::Status s = ApplyRecord(store_, record); !s.ok()) {
        return DataLoss(path, absl::StrCat("record #", sequence,
                                           " does not apply: ", s.message()));
      }
      ++report->records_replayed;
      *next_sequence = sequence + 1;
    }
    ++expected;
    offset += kRecordHeaderSize + length;
  }
  return absl::OkStatus();
}

absl::Status DurableState::WriteSnapshotFile(
    const std::vector<BatchNormModel>& models, uint64_t sequence,
    int64_t* bytes) {
  std::string out(kSnapshotMagic, kMagicSize);
  ByteWriter writer(out);
  writer.PutU32(kFormatVersion);
  writer.PutU64(sequence);
  writer.PutU64(models.size());
  for (const BatchNormModel& model : models) EncodeModel(model, writer);
  writer.PutU32(Crc32(out));
  *bytes = static_cast<int64_t>(out.size());

  const std::string temp = Join(options_.dir, kSnapshotTemp);
  const std::string path = Join(options_.dir, SnapshotFileName(sequence));
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return IoError("cannot create", temp);
  absl::Status s = WriteAll(fd, out, temp);
  if (s.ok() && ::fsync(fd) != 0) s = IoError("cannot sync", temp);
  ::close(fd);
  if (s.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    s = IoError("cannot rename to", path);
  }
  if (s.ok()) s = SyncDirectory(options_.dir);
  return s;
}

absl::Status DurableState::StartSegment(uint64_t first_sequence) {
  const std::string path = Join(options_.dir, SegmentFileName(first_sequence));
  const int fd = ::open(
      path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return IoError("cannot create", path);
  std::string header(kSegmentMagic, kMagicSize);
  ByteWriter writer(header);
  writer.PutU32(kFormatVersion);
  writer.PutU64(first_sequence);
  writer.PutU32(Crc32(header));
  absl::Status s = WriteAndSync(fd, header, path);
  if (s.ok()) s = SyncDirectory(options_.dir);
  if (!s.ok()) {
    ::close(fd);
    return s;
  }
  if (segment_fd_ >= 0) ::close(segment_fd_);
  segment_fd_ = fd;
  segment_first_ = first_sequence;
  return absl::OkStatus();
}

void DurableState::DropFilesBefore(uint64_t sequence) {
  absl::StatusOr<DirectoryListing> listing = ListDirectory(options_.dir);
  if (!listing.ok()) return;  // Old files only cost space; retried next time.
  for (uint64_t n : listing->snapshots) {
    if (n + 1 < sequence) {
      ::unlink(Join(options_.dir, SnapshotFileName(n)).c_str());
    }
  }
  for (uint64_t n : listing->segments) {
    if (n < sequence) ::unlink(Join(options_.dir, SegmentFileName(n)).c_str());
  }
}

void DurableState::SetObserver(DurabilityObserver* observer) {
  MutexLock lock(&mu_);
  observer_ = observer;
}

absl::Status DurableState::Healthy() {
  MutexLock lock(&mu_);
  return error_;
}

uint64_t DurableState::Append(const Mutation& mutation) {
  std::string payload;
  ByteWriter payload_writer(payload);
  EncodeMutation(mutation, payload_writer);
  // The record's checksum covers its sequence number and then the payload;
  // the payload's part is computed before taking the lock.
  const uint32_t payload_crc = Crc32(payload);
  MutexLock lock(&mu_);
  const uint64_t sequence = next_sequence_++;
  std::string sequence_bytes;
  ByteWriter(sequence_bytes).PutU64(sequence);
  ByteWriter frame(pending_);
  frame.PutU32(static_cast<uint32_t>(payload.size()));
  frame.PutU32(
      Crc32Combine(Crc32(sequence_bytes), payload_crc, payload.size()));
  pending_.append(sequence_bytes);
  pending_.append(payload);
  ++pending_records_;
  return sequence;
}

absl::Status DurableState::WaitDurable(uint64_t sequence) {
  MutexLock lock(&mu_);
  auto done = [this, sequence] {
    mu_.AssertReaderHeld();
    return durable_sequence_ >= sequence || !error_.ok();
  };
  mu_.Await(absl::Condition(&done));
  return durable_sequence_ >= sequence ? absl::OkStatus() : error_;
}

void DurableState::OnDurable(uint64_t sequence,
                             std::function<void(absl::Status)> done) {
  absl::Status now;
  {
    MutexLock lock(&mu_);
    if (durable_sequence_ < sequence && error_.ok()) {
      waiters_.emplace_back(sequence, std::move(done));
      return;
    }
    now = durable_sequence_ >= sequence ? absl::OkStatus() : error_;
  }
  done(now);
}

void DurableState::TakeReadyWaiters(std::vector<Waiter>* ready) {
  auto pending =
      std::partition(waiters_.begin(), waiters_.end(), [this](const Waiter& w) {
        mu_.AssertReaderHeld();
        return w.first > durable_sequence_ && error_.ok();
      });
  std::move(pending, waiters_.end(), std::back_inserter(*ready));
  waiters_.erase(pending, waiters_.end());
}

void DurableState::RunWaiters(std::vector<Waiter>& ready, uint64_t durable,
                              const absl::Status& error) {
  for (Waiter& w : ready) {
    w.second(w.first <= durable ? absl::OkStatus() : error);
  }
  ready.clear();
}

void DurableState::SyncLoop() {
  std::vector<Waiter> ready;
  while (true) {
    mu_.Lock();
    auto work = [this] {
      mu_.AssertReaderHeld();
      return !pending_.empty() || stopping_;
    };
    mu_.Await(absl::Condition(&work));
    if (pending_.empty()) {  // Stopping, everything written.
      mu_.Unlock();
      return;
    }
    // Write and sync everything queued so far; what is queued meanwhile
    // goes into the next sync.
    syncing_ = true;
    std::string batch;
    batch.swap(pending_);
    const int64_t records = std::exchange(pending_records_, 0);
    const uint64_t covered = next_sequence_ - 1;
    const int fd = segment_fd_;
    const std::string path =
        Join(options_.dir, SegmentFileName(segment_first_));
    const bool broken = !error_.ok();
    mu_.Unlock();
    absl::Status s;
    const auto start = std::chrono::steady_clock::now();
    if (!broken) {
      s = WriteAndSync(fd, batch, path);
    }
    const double seconds = SecondsSince(start);
    mu_.Lock();
    syncing_ = false;
    if (!s.ok()) {
      error_ = RefusalError(s);
    } else if (!broken) {
      durable_sequence_ = covered;
      log_bytes_since_snapshot_ += static_cast<int64_t>(batch.size());
      if (log_bytes_since_snapshot_ >= options_.snapshot_log_bytes) {
        snapshot_wanted_ = true;
      }
    }
    TakeReadyWaiters(&ready);
    const uint64_t durable = durable_sequence_;
    const absl::Status error = error_;
    DurabilityObserver* observer = observer_;
    mu_.Unlock();
    if (observer != nullptr && s.ok() && !broken) {
      observer->OnSync(records, static_cast<int64_t>(batch.size()), seconds);
    }
    RunWaiters(ready, durable, error);
    if (!s.ok()) ReportFailure();
  }
}

absl::StatusOr<uint64_t> DurableState::Rotate(FlushStats* flushed,
                                              std::vector<Waiter>* ready) {
  MutexLock lock(&mu_);
  auto idle = [this] {
    mu_.AssertReaderHeld();
    return !syncing_;
  };
  mu_.Await(absl::Condition(&idle));
  if (!error_.ok()) return error_;
  const uint64_t cut = next_sequence_ - 1;
  if (cut < segment_first_) return cut;  // The segment is empty: keep it.
  const std::string path = Join(options_.dir, SegmentFileName(segment_first_));
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = WriteAndSync(segment_fd_, pending_, path);
  *flushed = {pending_records_, static_cast<int64_t>(pending_.size()),
              SecondsSince(start)};
  if (s.ok()) {
    // These records are durable whether or not the next segment can be
    // started: their callers are acknowledged either way.
    pending_.clear();
    pending_records_ = 0;
    durable_sequence_ = cut;
    s = StartSegment(cut + 1);
  }
  if (!s.ok()) error_ = RefusalError(s);
  TakeReadyWaiters(ready);
  if (!error_.ok()) return error_;
  return cut;
}

absl::Status DurableState::Snapshot() {
  MutexLock snapshot_lock(&snapshot_mu_);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<uint64_t> cut;
  FlushStats flushed;
  std::vector<Waiter> ready;
  std::vector<BatchNormModel> models =
      store_.CaptureConsistent([&] { cut = Rotate(&flushed, &ready); });
  DurabilityObserver* observer = nullptr;
  uint64_t durable;
  {
    MutexLock lock(&mu_);
    observer = observer_;
    durable = durable_sequence_;
  }
  RunWaiters(ready, durable, cut.status());
  if (!cut.ok()) {
    ReportFailure();
    return cut.status();
  }
  if (observer != nullptr && flushed.records > 0) {
    observer->OnSync(flushed.records, flushed.bytes, flushed.seconds);
  }
  int64_t bytes = 0;
  if (absl::Status s = WriteSnapshotFile(models, *cut, &bytes); !s.ok()) {
    return s;
  }
  DropFilesBefore(*cut + 1);
  {
    MutexLock lock(&mu_);
    log_bytes_since_snapshot_ = 0;
    snapshot_wanted_ = false;
    observer = observer_;
  }
  if (observer != nullptr) observer->OnSnapshot(bytes, SecondsSince(start));
  return absl::OkStatus();
}

void DurableState::ReportFailure() {
  DurabilityObserver* observer;
  absl::Status error;
  {
    MutexLock lock(&mu_);
    if (error_.ok() || failure_reported_ || observer_ == nullptr) return;
    failure_reported_ = true;
    observer = observer_;
    error = error_;
  }
  if (observer != nullptr) observer->OnFailure(error);
}

absl::Status DurableState::Close() {
  {
    MutexLock lock(&mu_);
    // Only an error from now on would be the closing itself, not a failure.
    failure_reported_ = failure_reported_ || error_.ok();
  }
  absl::Status s = Snapshot();
  std::vector<Waiter> ready;
  uint64_t durable;
  absl::Status error;
  {
    MutexLock lock(&mu_);
    if (error_.ok()) {
      error_ = absl::UnavailableError("state_dir: the server is shutting down");
    }
    TakeReadyWaiters(&ready);
    durable = durable_sequence_;
    error = error_;
  }
  RunWaiters(ready, durable, error);
  return s;
}

void DurableState::SnapshotLoop() {
  while (true) {
    {
      MutexLock lock(&mu_);
      auto wake = [this] {
        mu_.AssertReaderHeld();
        return snapshot_wanted_ || stopping_;
      };
      mu_.Await(absl::Condition(&wake));
      if (stopping_) return;
    }
    if (!Snapshot().ok()) {
      // The error is sticky in error_ (or the snapshot file failed): retry
      // only when more log has accumulated.
      MutexLock lock(&mu_);
      snapshot_wanted_ = false;
      log_bytes_since_snapshot_ = 0;
    }
  }
}

}  // namespace normd::state

#include "server/state/durable_state.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/state/codec.h"
#include "server/state/manifest.h"
#include "server/state/state_files.h"

namespace normd::state {
namespace {

// The sticky error every later change gets once writing the log failed.
absl::Status RefusalError(const absl::Status& cause) {
  return absl::UnavailableError(
      absl::StrCat("state_dir: changes can no longer be made durable, so "
                   "they are refused: ",
                   cause.message()));
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

}  // namespace

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

  return ReplaceFile(options_.dir, kSnapshotTemp, SnapshotFileName(sequence),
                     out);
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
  return WriteManifest(first_sequence);
}

absl::Status DurableState::WriteManifest(uint64_t segment) {
  return ReplaceFile(
      options_.dir, kManifestTemp, kManifest,
      EncodeManifest({.snapshot = manifest_snapshot_, .segment = segment}));
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
  // Files are dropped only once the manifest names the snapshot that
  // covers them.
  manifest_snapshot_ = *cut;
  uint64_t segment;
  {
    MutexLock lock(&mu_);
    segment = segment_first_;
  }
  if (absl::Status s = WriteManifest(segment); !s.ok()) return s;
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

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
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
constexpr char kManifest[] = "MANIFEST";
constexpr char kManifestTemp[] = "MANIFEST.tmp";
constexpr char kManifestMagic[] = "normd-state-manifest 1";

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

// Makes `dir`/`name` hold exactly `bytes`, atomically: written to
// `dir`/`temp_name`, synced, renamed over `name`, the directory synced. A
// crash leaves either the old file or the new one.
absl::Status ReplaceFile(const std::string& dir, const std::string& temp_name,
                         const std::string& name, absl::string_view bytes) {
  const std::string temp = Join(dir, temp_name);
  const std::string path = Join(dir, name);
  const int fd =
      ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
  if (fd < 0) return IoError("cannot create", temp);
  absl::Status s = WriteAll(fd, bytes, temp);
  if (s.ok() && ::fsync(fd) != 0) s = IoError("cannot sync", temp);
  ::close(fd);
  if (s.ok() && ::rename(temp.c_str(), path.c_str()) != 0) {
    s = IoError("cannot rename to", path);
  }
  if (s.ok()) s = SyncDirectory(dir);
  return s;
}

// How a directory entry's name reads as "<prefix><20 digits><suffix>".
enum class NumberedName { kOther, kNumbered, kOutOfRange };

NumberedName ParseNumbered(absl::string_view name, absl::string_view prefix,
                           absl::string_view suffix, uint64_t* number) {
  if (name.size() != prefix.size() + 20 + suffix.size() ||
      name.substr(0, prefix.size()) != prefix ||
      name.substr(name.size() - suffix.size()) != suffix) {
    return NumberedName::kOther;
  }
  *number = 0;
  bool overflow = false;
  for (char c : name.substr(prefix.size(), 20)) {
    if (c < '0' || c > '9') return NumberedName::kOther;
    overflow = overflow ||
               __builtin_mul_overflow(*number, uint64_t{10}, number) ||
               __builtin_add_overflow(*number, uint64_t(c - '0'), number);
  }
  return overflow ? NumberedName::kOutOfRange : NumberedName::kNumbered;
}

struct DirectoryListing {
  std::vector<uint64_t> snapshots;  // Sorted.
  std::vector<uint64_t> segments;   // Sorted by first sequence.
  // Names shaped like a snapshot or segment whose number does not fit 64
  // bits: no normd wrote them.
  std::vector<std::string> out_of_range;
};

absl::StatusOr<DirectoryListing> ListDirectory(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return IoError("cannot list", dir);
  DirectoryListing listing;
  while (const dirent* e = ::readdir(d)) {
    for (const auto& [prefix, suffix, numbers] :
         {std::tuple{"snapshot-", ".snap", &listing.snapshots},
          std::tuple{"wal-", ".log", &listing.segments}}) {
      uint64_t n;
      switch (ParseNumbered(e->d_name, prefix, suffix, &n)) {
        case NumberedName::kNumbered:
          numbers->push_back(n);
          break;
        case NumberedName::kOutOfRange:
          listing.out_of_range.push_back(e->d_name);
          break;
        case NumberedName::kOther:
          break;
      }
    }
  }
  ::closedir(d);
  std::sort(listing.snapshots.begin(), listing.snapshots.end());
  std::sort(listing.segments.begin(), listing.segments.end());
  return listing;
}

// True when every byte of `bytes` is zero.
bool AllZero(absl::string_view bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

// What the marker file records: the newest snapshot and the log segment
// that changes go into.
struct Manifest {
  uint64_t snapshot = 0;
  uint64_t segment = 0;
};

std::string EncodeManifest(const Manifest& manifest) {
  std::string text =
      absl::StrFormat("%s\nsnapshot %020d\nsegment %020d\n", kManifestMagic,
                      manifest.snapshot, manifest.segment);
  absl::StrAppend(&text, absl::StrFormat("crc32 %08x\n", Crc32(text)));
  return text;
}

// The manifest in `text`, or nullopt if it is not one (damaged).
std::optional<Manifest> ParseManifest(absl::string_view text) {
  const size_t crc_at = text.rfind("crc32 ");
  if (crc_at == absl::string_view::npos) return std::nullopt;
  uint32_t crc = 0;
  if (!absl::SimpleHexAtoi(absl::StripAsciiWhitespace(text.substr(crc_at + 6)),
                           &crc) ||
      crc != Crc32(text.substr(0, crc_at))) {
    return std::nullopt;
  }
  std::vector<absl::string_view> lines =
      absl::StrSplit(text.substr(0, crc_at), '\n', absl::SkipEmpty());
  Manifest manifest;
  if (lines.size() != 3 || lines[0] != kManifestMagic ||
      !absl::ConsumePrefix(&lines[1], "snapshot ") ||
      !absl::SimpleAtoi(lines[1], &manifest.snapshot) ||
      !absl::ConsumePrefix(&lines[2], "segment ") ||
      !absl::SimpleAtoi(lines[2], &manifest.segment)) {
    return std::nullopt;
  }
  return manifest;
}

}  // namespace

absl::Status ReplayRecord(ModelStore& store, const MutationRecord& record) {
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
    case Mutation::Kind::kCreateAll:
      for (const BatchNormModel& model : record.models) store.Restore(model);
      return absl::OkStatus();
  }
  return absl::InternalError("unknown record kind");
}

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
  MutexLock snapshot_lock(&snapshot_mu_);
  ::unlink(Join(options_.dir, kSnapshotTemp).c_str());
  ::unlink(Join(options_.dir, kManifestTemp).c_str());
  absl::StatusOr<DirectoryListing> listing = ListDirectory(options_.dir);
  if (!listing.ok()) return listing.status();
  if (!listing->out_of_range.empty()) {
    return DataLoss(Join(options_.dir, listing->out_of_range.front()),
                    "its sequence number does not fit in 64 bits, so no normd "
                    "wrote it");
  }
  if (absl::Status s =
          CheckManifest(listing->snapshots, listing->segments, report);
      !s.ok()) {
    return s;
  }

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
      if (absl::Status s = DecodeModel(in, &model); !s.ok()) {
        return DataLoss(
            path, absl::StrCat("model ", i, " is malformed: ", s.message()));
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

  // A fresh snapshot of the recovered state, then a new, empty log (which
  // the manifest names), and only then are the files they cover dropped.
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
  manifest_snapshot_ = last_sequence;
  {
    MutexLock lock(&mu_);
    next_sequence_ = next_sequence;
    durable_sequence_ = last_sequence;
    if (absl::Status s = StartSegment(next_sequence); !s.ok()) return s;
  }
  DropFilesBefore(last_sequence + 1);
  return absl::OkStatus();
}

absl::Status DurableState::CheckManifest(const std::vector<uint64_t>& snapshots,
                                         const std::vector<uint64_t>& segments,
                                         RecoveryReport* report) {
  const std::string path = Join(options_.dir, kManifest);
  if (::access(path.c_str(), F_OK) != 0) {
    if (!snapshots.empty() || !segments.empty()) {
      report->warnings.push_back(absl::StrCat(
          path,
          " is missing (a state directory of an older normd, or the file was "
          "removed), so a removed newest log segment could not be detected "
          "this time; it is written now"));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  const std::optional<Manifest> manifest = ParseManifest(*text);
  if (!manifest.has_value()) {
    return DataLoss(path,
                    "damaged (not a normd manifest, or its checksum "
                    "fails)");
  }
  // Snapshots and segments are dropped only after the manifest names newer
  // ones, so the ones it names must be there.
  if (manifest->snapshot > 0 &&
      (snapshots.empty() || snapshots.back() < manifest->snapshot)) {
    return DataLoss(
        Join(options_.dir, SnapshotFileName(manifest->snapshot)),
        absl::StrCat("missing: ", path,
                     " names it as the newest snapshot (every change up to "
                     "record #",
                     manifest->snapshot, ")"));
  }
  if (!std::binary_search(segments.begin(), segments.end(),
                          manifest->segment)) {
    return DataLoss(
        Join(options_.dir, SegmentFileName(manifest->segment)),
        absl::StrCat("missing: ", path,
                     " names it as the current log segment (the changes "
                     "from record #",
                     manifest->segment, " on)"));
  }
  return absl::OkStatus();
}

absl::Status DurableState::ReplaySegment(const std::string& path, bool last,
                                         uint64_t* next_sequence,
                                         RecoveryReport* report) {
  absl::StatusOr<std::string> bytes = ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  const absl::string_view file(*bytes);
  if (last && (file.size() < kSegmentHeaderSize || AllZero(file))) {
    // StartSegment syncs the header before any record goes in: a crash
    // came first.
    report->warnings.push_back(absl::StrCat(
        path, ": dropped a segment whose header was never ",
        "completely written (", file.size(), " bytes); it held no records"));
    return absl::OkStatus();
  }
  if (file.size() < kSegmentHeaderSize) {
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
        path, absl::StrCat("starts at record #", first,
                           " but what comes before it ends at record #",
                           *next_sequence - 1, ": records #", *next_sequence,
                           " to #", first - 1,
                           " are missing (a log segment or the snapshot "
                           "holding them was removed)"));
  }
  size_t offset = kSegmentHeaderSize;
  uint64_t expected = first;
  while (offset < file.size()) {
    const size_t left = file.size() - offset;
    ByteReader frame(file.substr(offset));
    uint32_t length = 0, crc = 0;
    uint64_t sequence = 0;
    const bool has_header = left >= kRecordHeaderSize &&
                            frame.GetU32(&length) && frame.GetU32(&crc) &&
                            frame.GetU64(&sequence);
    if (has_header && length == 0 && crc == 0 && sequence == 0 &&
        AllZero(file.substr(offset))) {
      // Zeros where the next record would start (preallocated space, or a
      // crash before the record's bytes reached the disk): the log ends.
      break;
    }
    if (!has_header || length > left - kRecordHeaderSize) {
      if (last) {
        report->warnings.push_back(absl::StrCat(
            path, ": dropped a torn record at offset ", offset, " (", left,
            " bytes to the end of the file, shorter than the record "
            "claims): a write cut off by a crash. A change is acknowledged "
            "only once its record is whole on disk; if the disk lost data "
            "it had confirmed, this is where"));
        return absl::OkStatus();
      }
      return DataLoss(path, absl::StrCat("record at offset ", offset,
                                         " is truncated, and a newer "
                                         "segment follows"));
    }
    const absl::string_view checked = file.substr(offset + 8, 8 + length);
    if (Crc32(checked) != crc) {
      const bool ends_log =
          last && offset + kRecordHeaderSize + length == file.size();
      return DataLoss(
          path,
          absl::StrCat(
              "the record at offset ", offset, " (", kRecordHeaderSize + length,
              " bytes) fails its checksum",
              ends_log ? absl::StrCat("; it is the log's last record: if it "
                                      "was being written when the server "
                                      "crashed, it was not acknowledged, "
                                      "and truncating the file to ",
                                      offset, " bytes drops it")
                       : std::string()));
    }
    if (sequence != expected) {
      return DataLoss(path, absl::StrCat("record at offset ", offset, " is #",
                                         sequence, ", expected #", expected));
    }
    if (sequence >= *next_sequence) {
      MutationRecord record;
      if (absl::Status s = DecodeMutation(checked.substr(8), &record);
          !s.ok()) {
        return DataLoss(
            path, absl::StrCat("record #", sequence, " at offset ", offset,
                               " is malformed: ", s.message()));
      }
      if (absl::Status s = ReplayRecord(store_, record); !s.ok()) {
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

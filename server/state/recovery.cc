// Start-up recovery of a state directory (DurableState::Recover): the
// newest valid snapshot, then every log segment after it replayed into the
// store, checked against the MANIFEST; what the recovery table of
// docs/reliability.md says stops start-up stops it here, naming the file
// and the offset.
#include <cinttypes>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/state/codec.h"
#include "server/state/durable_state.h"
#include "server/state/manifest.h"
#include "server/state/state_files.h"

namespace normd::state {

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
    if (!in.GetU32(&version) || version < kOldestFormatVersion ||
        version > kFormatVersion || !in.GetU64(&sequence) ||
        sequence != snapshot_sequence || !in.GetU64(&count)) {
      return DataLoss(path, "unsupported version or wrong sequence number");
    }
    for (uint64_t i = 0; i < count; ++i) {
      BatchNormModel model;
      if (absl::Status s = DecodeModel(in, &model, version); !s.ok()) {
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
      version < kOldestFormatVersion || version > kFormatVersion) {
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
      if (absl::Status s = DecodeMutation(checked.substr(8), &record, version);
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

}  // namespace normd::state

// Durable model state: a directory holding checksummed snapshots of a
// ModelStore and a write-ahead log of every change since.
//
//   <dir>/LOCK                      flock()ed while a normd owns the dir
//   <dir>/snapshot-<seq>.snap       every model as of log record <seq>
//   <dir>/wal-<first seq>.log       records <first seq>, <first seq> + 1, ...
//   <dir>/MANIFEST                  the newest snapshot and the current
//                                   segment, rewritten (atomically) and
//                                   synced whenever either changes
//
// Open() loads the newest snapshot, replays the log after it, writes a fresh
// snapshot and starts a new log segment. Every change of the store is then
// queued in the log under the store's locks and acknowledged only after an
// fdatasync that covers it. One writer thread syncs whatever is queued, in a
// loop, so all changes queued during one sync share the next (group commit).
// When the log has grown past snapshot_log_bytes a second background thread
// writes a new snapshot and drops the segments it covers.
//
// Recovery rules: zero bytes where the next record would start end the log
// (preallocation, or a crash before the record reached the disk); an
// incomplete record at the very end of the newest segment is a torn write,
// dropped with a warning; a complete record whose checksum fails (anywhere),
// a gap in the record numbers, a snapshot or segment the MANIFEST names but
// the directory lacks, or any other damage stops Open with DATA_LOSS naming
// the file (and the offset). Files are dropped only after the MANIFEST names
// newer ones. What cannot be detected: a log cut exactly at a record
// boundary after the last rotation, and the removal of MANIFEST itself
// (recovery then warns and writes a new one).
//
// Thread-safe: any number of threads may change the store at once; Snapshot
// and Close may be called from any thread.
#ifndef NORMD_SERVER_STATE_DURABLE_STATE_H_
#define NORMD_SERVER_STATE_DURABLE_STATE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/core/model_store.h"
#include "server/core/mutation_log.h"
#include "server/core/sync.h"
#include "server/state/codec.h"

namespace normd::state {

struct DurableStateOptions {
  std::string dir;
  // A snapshot is written (and older log segments dropped) once the log has
  // grown by this many bytes since the last one.
  int64_t snapshot_log_bytes = 64 << 20;
};

// What Open found and did, for the server's log.
struct RecoveryReport {
  std::string snapshot_file;  // Empty if the directory had none.
  int64_t models = 0;         // After replay.
  int64_t records_replayed = 0;
  std::vector<std::string> warnings;
};

// Told about every sync and snapshot (e.g. to export metrics). Called from
// the syncing thread, outside the state's locks.
class DurabilityObserver {
 public:
  virtual ~DurabilityObserver() = default;
  virtual void OnSync(int64_t records, int64_t bytes, double seconds) = 0;
  virtual void OnSnapshot(int64_t bytes, double seconds) = 0;
  // Once, when writing the log or a snapshot failed for good: from then on
  // every change is refused with `error` (UNAVAILABLE).
  virtual void OnFailure(const absl::Status& error) = 0;
};

class DurableState final : public MutationLog {
 public:
  // Recovers `store` (which must be empty) from options.dir, creating the
  // directory if needed, and attaches itself as the store's log. FAILED_
  // PRECONDITION if another process holds the directory; DATA_LOSS naming
  // the file for a corrupt snapshot or log; the I/O error otherwise.
  static absl::StatusOr<std::unique_ptr<DurableState>> Open(
      const DurableStateOptions& options, ModelStore& store,
      RecoveryReport* report);

  // Detaches from the store and stops the background thread; does not
  // snapshot (see Close).
  ~DurableState() override;

  void SetObserver(DurabilityObserver* observer);

  // Writes a snapshot of the store now and drops the log it covers.
  absl::Status Snapshot();

  // A final snapshot; later changes are refused (UNAVAILABLE).
  absl::Status Close();

  // MutationLog.
  absl::Status Healthy() override;
  uint64_t Append(const Mutation& mutation) override;
  absl::Status WaitDurable(uint64_t sequence) override;
  void OnDurable(uint64_t sequence,
                 std::function<void(absl::Status)> done) override;

 private:
  DurableState(const DurableStateOptions& options, ModelStore& store,
               int lock_fd);
  absl::Status Recover(RecoveryReport* report);
  // DATA_LOSS if the MANIFEST is damaged or names a snapshot or segment the
  // directory lacks; a warning if it is missing.
  // `snapshots` and `segments`: the sorted numbers of those in the dir.
  absl::Status CheckManifest(const std::vector<uint64_t>& snapshots,
                             const std::vector<uint64_t>& segments,
                             RecoveryReport* report);
  absl::Status ReplaySegment(const std::string& path, bool last,
                             uint64_t* next_sequence, RecoveryReport* report);
  absl::Status WriteSnapshotFile(const std::vector<BatchNormModel>& models,
                                 uint64_t sequence, int64_t* bytes);
  // Creates and syncs segment `first_sequence`, makes it the current one
  // and names it in the MANIFEST.
  absl::Status StartSegment(uint64_t first_sequence)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_, snapshot_mu_);
  // Rewrites the MANIFEST: manifest_snapshot_ and `segment`.
  absl::Status WriteManifest(uint64_t segment)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_);
  // What one flush wrote.
  struct FlushStats {
    int64_t records = 0;
    int64_t bytes = 0;
    double seconds = 0;
  };
  using Waiter = std::pair<uint64_t, std::function<void(absl::Status)>>;
  // Flushes queued records into the current segment and, if it holds any,
  // starts a new one. Called while the store is paused. Returns the last
  // record covered by the old segments; `ready` receives the waiters it
  // made durable, to be called once the store runs again.
  absl::StatusOr<uint64_t> Rotate(FlushStats* flushed,
                                  std::vector<Waiter>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(snapshot_mu_);
  // Moves the waiters that are durable (or can never be) into `ready`.
  void TakeReadyWaiters(std::vector<Waiter>* ready)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls each waiter with OK or, if it was not made durable, `error`.
  static void RunWaiters(std::vector<Waiter>& ready, uint64_t durable,
                         const absl::Status& error);
  void DropFilesBefore(uint64_t sequence);
  // Tells the observer about a new sticky error (once; not for Close).
  void ReportFailure();
  void SyncLoop();
  void SnapshotLoop();

  const DurableStateOptions options_;
  ModelStore& store_;
  const int lock_fd_;

  Mutex snapshot_mu_;  // One snapshot at a time.
  // The newest snapshot written, as the MANIFEST names it.
  uint64_t manifest_snapshot_ ABSL_GUARDED_BY(snapshot_mu_) = 0;

  Mutex mu_;
  DurabilityObserver* observer_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string pending_ ABSL_GUARDED_BY(mu_);  // Framed, not yet written.
  int64_t pending_records_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t durable_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  bool syncing_ ABSL_GUARDED_BY(mu_) = false;  // SyncLoop is writing.
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // Sticky.
  bool failure_reported_ ABSL_GUARDED_BY(mu_) = false;
  int segment_fd_ ABSL_GUARDED_BY(mu_) = -1;
  uint64_t segment_first_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t log_bytes_since_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  bool snapshot_wanted_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sync_thread_;
  std::thread snapshot_thread_;
};

// Applies one decoded log record to `store` (which has no log attached), as
// recovery does: the change the record describes, bit for bit. The error of
// the store if it does not apply.
absl::Status ReplayRecord(ModelStore& store, const MutationRecord& record);

// File names inside a state directory.
std::string SnapshotFileName(uint64_t sequence);
std::string SegmentFileName(uint64_t first_sequence);

}  // namespace normd::state

#endif  // NORMD_SERVER_STATE_DURABLE_STATE_H_

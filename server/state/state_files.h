// The files of a state directory (server/state/durable_state.h): their
// format constants and names, and the POSIX steps that read, write, sync
// and replace them, each failure an absl::Status naming the path. Stateless
// functions; thread-safe where the files they touch are not shared.
#ifndef NORMD_SERVER_STATE_STATE_FILES_H_
#define NORMD_SERVER_STATE_STATE_FILES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace normd::state {

inline constexpr char kSnapshotMagic[] = "NORMDSNP";
inline constexpr char kSegmentMagic[] = "NORMDWAL";
// The format written: 2 ends every model with its drift reference (or a
// zero byte for none); 1 had none. Files of both are read.
inline constexpr uint32_t kFormatVersion = 2;
inline constexpr uint32_t kOldestFormatVersion = 1;
inline constexpr size_t kMagicSize = 8;
inline constexpr size_t kSegmentHeaderSize = kMagicSize + 4 + 8 + 4;
// length, crc, sequence.
inline constexpr size_t kRecordHeaderSize = 4 + 4 + 8;
inline constexpr char kSnapshotTemp[] = "snapshot.tmp";

std::string Join(const std::string& dir, const std::string& name);

// errno as a status, naming `what` and `path`.
absl::Status IoError(absl::string_view what, const std::string& path);

// DATA_LOSS naming `path` and `what`, and that start-up stops.
absl::Status DataLoss(const std::string& path, absl::string_view what);

absl::Status WriteAll(int fd, absl::string_view bytes, const std::string& path);

// Writes `bytes` to `fd` and makes them durable (fdatasync).
absl::Status WriteAndSync(int fd, absl::string_view bytes,
                          const std::string& path);

// The whole of a regular file (DATA_LOSS for anything else).
absl::StatusOr<std::string> ReadFile(const std::string& path);

absl::Status SyncDirectory(const std::string& dir);

// Makes `dir`/`name` hold exactly `bytes`, atomically: written to
// `dir`/`temp_name`, synced, renamed over `name`, the directory synced. A
// crash leaves either the old file or the new one.
absl::Status ReplaceFile(const std::string& dir, const std::string& temp_name,
                         const std::string& name, absl::string_view bytes);

// The snapshots and log segments a state directory holds, by number.
struct DirectoryListing {
  std::vector<uint64_t> snapshots;  // Sorted.
  std::vector<uint64_t> segments;   // Sorted by first sequence.
  // Names shaped like a snapshot or segment whose number does not fit 64
  // bits: no normd wrote them.
  std::vector<std::string> out_of_range;
};

absl::StatusOr<DirectoryListing> ListDirectory(const std::string& dir);

// True when every byte of `bytes` is zero.
bool AllZero(absl::string_view bytes);

}  // namespace normd::state

#endif  // NORMD_SERVER_STATE_STATE_FILES_H_

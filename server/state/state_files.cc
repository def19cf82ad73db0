#include "server/state/state_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/state/durable_state.h"

namespace normd::state {
namespace {

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

}  // namespace

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

absl::Status WriteAndSync(int fd, absl::string_view bytes,
                          const std::string& path) {
  absl::Status s = WriteAll(fd, bytes, path);
  if (s.ok() && ::fdatasync(fd) != 0) s = IoError("cannot sync", path);
  return s;
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

bool AllZero(absl::string_view bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](char c) { return c == 0; });
}

std::string SnapshotFileName(uint64_t sequence) {
  return absl::StrFormat("snapshot-%020d.snap", sequence);
}

std::string SegmentFileName(uint64_t first_sequence) {
  return absl::StrFormat("wal-%020d.log", first_sequence);
}

}  // namespace normd::state

// The MANIFEST of a state directory: a small text file, replaced
// atomically and fsynced at each rotation, that records the newest snapshot
// and the log segment changes go into, with a CRC-32 of its text, so that
// recovery finds a missing segment or a gap. Pure functions; thread-safe.
#ifndef NORMD_SERVER_STATE_MANIFEST_H_
#define NORMD_SERVER_STATE_MANIFEST_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace normd::state {

inline constexpr char kManifest[] = "MANIFEST";
inline constexpr char kManifestTemp[] = "MANIFEST.tmp";

// What the marker file records: the newest snapshot and the log segment
// that changes go into.
struct Manifest {
  uint64_t snapshot = 0;
  uint64_t segment = 0;
};

std::string EncodeManifest(const Manifest& manifest);

// The manifest in `text`, or nullopt if it is not one (damaged).
std::optional<Manifest> ParseManifest(absl::string_view text);

}  // namespace normd::state

#endif  // NORMD_SERVER_STATE_MANIFEST_H_

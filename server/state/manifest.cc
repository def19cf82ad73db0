#include "server/state/manifest.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/state/codec.h"

namespace normd::state {
namespace {

constexpr char kManifestMagic[] = "normd-state-manifest 1";

}  // namespace

std::string EncodeManifest(const Manifest& manifest) {
  std::string text =
      absl::StrFormat("%s\nsnapshot %020d\nsegment %020d\n", kManifestMagic,
                      manifest.snapshot, manifest.segment);
  absl::StrAppend(&text, absl::StrFormat("crc32 %08x\n", Crc32(text)));
  return text;
}

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

}  // namespace normd::state

#include "server/service/flag_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace normd {

absl::StatusOr<std::string> ReadFlagFile(const std::string& path,
                                         absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream contents;
  contents << in.rdbuf();
  if (!in || contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        flag, ": cannot read ", path, " (missing, unreadable or empty)"));
  }
  return contents.str();
}

}  // namespace normd

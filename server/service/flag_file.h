// Reading a file a command-line flag names (TLS certificates and keys, the
// bearer token). Stateless; thread-safe.
#ifndef NORMD_SERVER_SERVICE_FLAG_FILE_H_
#define NORMD_SERVER_SERVICE_FLAG_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace normd {

// The contents of the file `path` given by `flag`; INVALID_ARGUMENT naming
// the flag if it cannot be read or is empty.
absl::StatusOr<std::string> ReadFlagFile(const std::string& path,
                                         absl::string_view flag);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_FLAG_FILE_H_

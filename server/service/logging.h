// Minimal structured logging to stderr: one line per event, with a UTC
// timestamp and severity. (Debian 12's Abseil 20220623 predates absl/log.)
// Thread-safe: each line is written with a single write.
#ifndef NORMD_SERVER_SERVICE_LOGGING_H_
#define NORMD_SERVER_SERVICE_LOGGING_H_

#include "absl/strings/string_view.h"

namespace normd {

enum class LogSeverity { kInfo, kWarning, kError };

void Log(LogSeverity severity, absl::string_view message);

}  // namespace normd

#endif  // NORMD_SERVER_SERVICE_LOGGING_H_

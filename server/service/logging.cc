#include "server/service/logging.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace normd {

void Log(LogSeverity severity, absl::string_view message) {
  const char* level = severity == LogSeverity::kInfo      ? "I"
                      : severity == LogSeverity::kWarning ? "W"
                                                          : "E";
  const std::string line =
      absl::StrCat(absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(),
                                    absl::UTCTimeZone()),
                   " ", level, " normd: ", message, "\n");
  // One write keeps concurrent lines whole.
  [[maybe_unused]] ssize_t written =
      write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace normd

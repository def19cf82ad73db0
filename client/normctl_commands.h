// normctl's command table and strict command line: every command with its
// synopsis, its description and its own flags (each described as that
// command reads it), the flags every command takes, and a parser that sets
// Abseil flags but refuses what Abseil would accept or exit 1 on: an unknown
// flag (with the closest known one suggested), a bad value, a flag the
// command does not read, a missing required flag. All of those are usage
// errors: normctl exits 2 before any network. Stateless apart from the
// process's flags; not for use from several threads.
#ifndef NORMD_CLIENT_NORMCTL_COMMANDS_H_
#define NORMD_CLIENT_NORMCTL_COMMANDS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace normd::client {

// One of a command's flags and what it means for that command.
struct CommandFlag {
  const char* name;
  const char* help;
};

// One subcommand.
struct Command {
  const char* name;
  const char* synopsis;
  const char* description;
  std::vector<CommandFlag> flags;
  // Flags that must be given (non-empty); their absence is a usage error.
  std::vector<const char*> required;
  // When not empty, exactly one of these flags must be given.
  std::vector<const char*> one_of;
};

const std::vector<Command>& Commands();
const Command* FindCommand(absl::string_view name);

// normctl's own --help: the commands and their synopses.
std::string Usage();

// `normctl COMMAND --help`: the command, its flags, the common flags.
std::string CommandHelp(const Command& command);

// A parsed command line: the command and the flags given (names).
struct CommandLine {
  const Command* command = nullptr;
  std::vector<std::string> given;
};

// Sets the flags of argv[1..] (--name=value, --name value, --bool,
// --nobool) and finds the command. INVALID_ARGUMENT, naming the flag or the
// command, for anything a user got wrong.
absl::StatusOr<CommandLine> ParseNormctlCommandLine(int argc, char** argv);

}  // namespace normd::client

#endif  // NORMD_CLIENT_NORMCTL_COMMANDS_H_

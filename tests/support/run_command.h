// run_command(): runs a shell command line, capturing stdout and stderr separately.
#pragma once

#include <string>

namespace deepspeed::testing {

struct CommandResult {
  int exit_code = -1;
  std::string out, err;
};

/// Runs `command` with /bin/sh; stdout and stderr are captured through temporary files.
CommandResult run_command(const std::string& command);

}  // namespace deepspeed::testing

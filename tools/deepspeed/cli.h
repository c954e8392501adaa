// The `deepspeed` command line: DeepSpeed runner.py flag names -> LauncherOptions. Owns which flags
// are accepted, which are recognised and rejected (multi-node, elastic, autotuning, --module), and
// where the launcher's options stop: at PROGRAM, after which every argument belongs to PROGRAM.
#pragma once

#include <string>
#include <vector>

#include "launch_plan.h"

namespace deepspeed::launcher {

struct CommandLine {
  LauncherOptions options;
  bool help_requested = false;  // -h/--help: print help_text and exit 0, start nothing
  std::string help_text;
  std::vector<std::string> warnings;  // e.g. the missing-hostfile warning DeepSpeed prints
};

// Parses the launcher's arguments (argv without argv[0]). Throws UsageError (exit 2) naming the
// offending flag for: an unknown option before PROGRAM, a missing PROGRAM, a bad value, --module,
// and every multi-node/elastic/autotuning flag ("multi-node launching is not supported yet").
// Exception, as in DeepSpeed: -H/--hostfile naming a file that does not exist only warns
// "Unable to find hostfile, will proceed with training with local resources only.".
CommandLine parse_command_line(const std::vector<std::string>& args);

}  // namespace deepspeed::launcher

// The `deepspeed` command line: DeepSpeed runner.py flag names -> LauncherOptions. Owns which flags
// are accepted, which are recognised and rejected (elastic training, --module), and
// where the launcher's options stop: at PROGRAM, after which every argument belongs to PROGRAM.
// The per-node flags (--world_info, --node_rank, --stop_on_stdin_eof) select per-node mode, what
// the launcher runs on each host of a multi-node job.
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
// offending flag for: an unknown option before PROGRAM, a missing PROGRAM, a bad value (also
// --autotuning other than tune|run), --module, the elastic-training flags, and an unknown
// --launcher. An -H/--hostfile given on
// the command line that does not exist only warns, as in DeepSpeed: "Unable to find hostfile, will
// proceed with training with local resources only.".
CommandLine parse_command_line(const std::vector<std::string>& args);

}  // namespace deepspeed::launcher

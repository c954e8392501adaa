// run_local(): executes a LaunchPlan on this machine: one child per rank, prefixed "[rank R] ",
// optionally logged per rank. The process handling itself is process_runner.h's.
#pragma once

#include <string>

#include "host_info.h"
#include "launch_plan.h"

namespace deepspeed::launcher {

struct LocalRunOptions {
  // Seconds between SIGTERM/SIGINT to the ranks and SIGKILL (DeepSpeed: 30).
  double kill_grace_s = kDefaultKillGraceSeconds;
  // --enable_each_rank_log: directory for <timestamp>_rank<R>.log copies of each rank's output
  // (stdout and stderr, unprefixed); "" = off. Created if missing.
  std::string each_rank_log_dir;
  // Per-node mode under a multi-node controller (--stop_on_stdin_eof): see Note [Stdin lifeline]
  // in process_runner.h.
  bool controlled_by_stdin = false;
};

// Starts every rank of `plan` and returns the exit status described at run_processes(): 0, the
// first failing rank's status, or 1 when the launcher was signalled. Throws UsageError if the
// per-rank log directory cannot be created (nothing started yet), and std::system_error if a rank
// cannot be started.
int run_local(const LaunchPlan& plan, const LocalRunOptions& options);

}  // namespace deepspeed::launcher

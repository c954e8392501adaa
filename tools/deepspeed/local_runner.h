// run_local(): executes a LaunchPlan on this machine. Owns the rank processes: spawning (each in
// its own process group), relaying their output line by line with "[rank R] " prefixes, signal
// forwarding, and stopping every rank when one fails. Single-threaded: one poll() loop.
#pragma once

#include <string>

#include "host_info.h"
#include "launch_plan.h"

namespace deepspeed::launcher {

struct RunnerOptions {
  // Seconds between SIGTERM/SIGINT to the ranks and SIGKILL (DeepSpeed: 30).
  double kill_grace_s = kDefaultKillGraceSeconds;
  // --enable_each_rank_log: directory for <timestamp>_rank<R>.log copies of each rank's output
  // (stdout and stderr, unprefixed); "" = off. Created if missing.
  std::string each_rank_log_dir;
};

// Starts every rank of `plan` and returns once all of them have exited, with the launcher's exit
// status:
//   0                 every rank exited 0;
//   the rank's status the first rank to exit non-zero (128 + signal if a signal killed it): the
//                     others get SIGTERM to their process groups, then SIGKILL after kill_grace_s;
//   1                 the launcher got SIGINT/SIGTERM: forwarded to every rank's process group,
//                     SIGKILL after kill_grace_s (a second SIGINT/SIGTERM sends SIGKILL at once).
// Ranks run with stdin from /dev/null; rank stdout goes to our stdout and rank stderr to our
// stderr, whole lines only. Must be called from a single-threaded process (it forks); installs
// SIGCHLD/SIGINT/SIGTERM handlers for its duration and ignores SIGPIPE.
// Throws UsageError if the per-rank log directory cannot be created (nothing started yet), and
// std::system_error if a rank cannot be started (ranks already started are killed and reaped).
int run_local(const LaunchPlan& plan, const RunnerOptions& options);

}  // namespace deepspeed::launcher

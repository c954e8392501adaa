// run_processes(): starts a set of child processes and owns them until all have exited: spawning
// (each in its own process group), relaying their output line by line with a per-child prefix,
// signal forwarding, and stopping every child when one fails. Single-threaded: one poll() loop.
// The children are the ranks of a local launch (local_runner.h) or, on the multi-node
// controller, one ssh per host running that host's per-node launcher (multinode_runner.h).
//
// Note [Stdin lifeline]: a per-node launcher started through ssh cannot be signalled by the
// controller directly (killing the ssh client does not kill the remote command without a tty). So
// the controller keeps a pipe to each ssh's stdin, and the per-node launcher (--stop_on_stdin_eof)
// watches its stdin: a line "SIGINT" or "SIGTERM" forwards that signal to its ranks, and EOF — the
// controller closed the pipe, died, or the connection dropped — stops them with SIGTERM. Per-node
// launchers report the first rank that failed on their host as one stderr line starting with
// kNodeReportPrefix; the controller consumes it to name host, rank and status in one message.
#pragma once

#include <string>
#include <vector>

#include "host_info.h"

namespace deepspeed::launcher {

inline constexpr const char* kNodeReportPrefix = "deepspeed-node: ";

struct ChildSpec {
  std::string label;          // how messages name it: "rank 3", "host 10.0.0.2 (node 1)", "mpirun"
  std::string output_prefix;  // put before every relayed line: "[rank 3] ", "10.0.0.2: ", or ""
  std::string exec_path;      // what to execve()
  std::vector<std::string> argv;
  std::vector<EnvVar> env;    // set on top of the runner's environment, in this order
  std::vector<int> cpu_cores; // sched_setaffinity mask; empty = inherit
  std::string log_path;       // also copy the raw output here (--enable_each_rank_log); "" = off
  // Runs a per-node launcher in --stop_on_stdin_eof mode: stdin is the lifeline and stderr may
  // carry its failure report. See Note [Stdin lifeline].
  bool remote_node = false;
};

struct RunnerOptions {
  // Seconds between stopping the children (SIGTERM/SIGINT, or the lifeline message) and SIGKILL.
  double kill_grace_s = kDefaultKillGraceSeconds;
  // "rank" or "host": how the children are counted in messages ("stopping the other 3 host(s)").
  std::string unit = "rank";
  // Per-node mode under a controller: watch our own stdin and report the first failure (see Note
  // [Stdin lifeline]).
  bool controlled_by_stdin = false;
};

// Starts every child and returns once all have exited, with the exit status:
//   0                  every child exited 0;
//   the child's status the first child to exit non-zero (128 + signal if a signal killed it): the
//                      others are stopped (SIGTERM to their process groups, or "SIGTERM" on the
//                      lifeline) and SIGKILLed after kill_grace_s;
//   1                  the runner got SIGINT/SIGTERM (or, under a controller, a stop request or EOF
//                      on stdin): forwarded the same way, SIGKILL after kill_grace_s (a second
//                      SIGINT/SIGTERM sends SIGKILL at once).
// Children's stdin is /dev/null (or the lifeline pipe); stdout goes to our stdout and stderr to our
// stderr, whole lines only. Must be called from a single-threaded process (it forks); installs
// SIGCHLD/SIGINT/SIGTERM handlers for its duration and ignores SIGPIPE. Throws UsageError if a log
// file cannot be created (nothing started yet), and std::system_error if a child cannot be started
// (children already started are killed and reaped).
int run_processes(const std::vector<ChildSpec>& children, const RunnerOptions& options);

}  // namespace deepspeed::launcher

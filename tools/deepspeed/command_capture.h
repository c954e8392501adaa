// run_and_capture(): runs a short helper command (the `ssh HOST hostname -I` probes of a multi-node
// launch) to completion under a timeout and returns its output. Not for ranks: those go through
// process_runner.h.
#pragma once

#include <string>
#include <vector>

namespace deepspeed::launcher {

struct CaptureResult {
  int exit_code = -1;     // 128 + signal when killed; -1 when it could not be started
  bool timed_out = false; // killed after timeout_s
  std::string out;        // stdout
  std::string err;        // stderr
};

// Runs argv (argv[0] found on PATH) with stdin from /dev/null in its own process group; after
// `timeout_s` the group is SIGKILLed. Never throws for the command's failure; the caller reads
// exit_code and err.
CaptureResult run_and_capture(const std::vector<std::string>& argv, double timeout_s);

}  // namespace deepspeed::launcher

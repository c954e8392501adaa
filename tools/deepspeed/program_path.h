// Finding PROGRAM before any rank starts, so a typo fails once with a clear message instead of N
// ranks each failing to exec.
#pragma once

#include <string>

namespace deepspeed::launcher {

// Returns the path to execute for `program`: `program` itself if it contains a '/', else the first
// PATH entry holding an executable file of that name (as execvp would). Throws UsageError naming
// `program` when it does not exist, is a directory or is not executable, with a hint for Python
// scripts (this launcher runs executables, so `deepspeed train.py` becomes `deepspeed python3
// train.py`).
std::string resolve_program(const std::string& program, const std::string& path_env);

}  // namespace deepspeed::launcher

// UsageError: the command line or the launcher's environment is wrong, found before any rank starts.
// main() prints it and exits kUsageExitCode (2), as argparse does for DeepSpeed's runner.
#pragma once

#include <stdexcept>

namespace deepspeed::launcher {

inline constexpr int kUsageExitCode = 2;

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace deepspeed::launcher

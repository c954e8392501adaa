// One directory shared by every run_ranks() call of a test (each call gets its own
// rank_output_dir()): made by the parent at the start of the test and handed to the ranks in the
// environment variable `env`, so that a reference run and a distributed run can compare files.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "support/multi_rank.h"
#include "support/temp_dir.h"

namespace deepspeed::testing {

/// In the parent: a fresh directory (alive until the binary exits), exported as `env`. In a rank:
/// the directory the parent exported.
inline std::string new_shared_run_dir(const char* env) {
  if (!in_rank_process()) {
    static std::vector<std::unique_ptr<TempDir>> dirs;
    dirs.push_back(std::make_unique<TempDir>("ds_shared"));
    ::setenv(env, dirs.back()->path().c_str(), 1);
  }
  return std::getenv(env);
}

}  // namespace deepspeed::testing

// run_ranks(): runs a test body in N processes, one per rank, on Gloo over loopback.
// The parent re-executes this test binary N times (only the current test, via --gtest_filter)
// with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set; in each child run_ranks() initializes
// deepspeed::comm, runs `body`, and exits. Re-exec (not fork) keeps children free of the
// parent's OpenMP and LibTorch state. A TEST may call run_ranks() several times (e.g. train and
// save, then load in new processes): the n-th call's processes skip the earlier calls, which
// return an empty result in them, so code between two calls must not assume it runs only in
// the parent (guard it with `if (!in_rank_process())`).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace deepspeed::testing {

struct RankResult {
  int rank = 0;
  int exit_code = -1;   // -1 when killed by a signal
  int term_signal = 0;  // the signal that ended it, 0 otherwise
  std::string output;   // stdout + stderr of the rank
};

struct RunOptions {
  double timeout_s = 120.0;
  bool expect_failure = false;  // do not fail the test when a rank fails
  std::vector<std::pair<std::string, std::string>> env;  // extra environment for every rank
  int comm_timeout_ms = 60000;  // per-collective timeout inside the ranks
  bool init_distributed = true;  // false: the body calls comm::init_distributed itself (or not)
};

/// True inside a rank process started by run_ranks().
bool in_rank_process();

/// Runs `body(rank, world_size)` on `world_size` ranks. In the parent: returns each rank's
/// result (and ADD_FAILUREs with every rank's output if one failed, unless expect_failure).
/// In a rank process: never returns.
std::vector<RankResult> run_ranks(int world_size, const std::function<void(int, int)>& body,
                                  const RunOptions& options = {});

/// A directory shared by the parent and its ranks for result files (created per run).
std::string rank_output_dir();

}  // namespace deepspeed::testing

// `deepspeed --autotuning tune|run`: DeepSpeed's autotuner (autotuning/autotuner.py) on this
// launcher. A model-information run, then per ZeRO stage the user asks for (a number, a list or
// "all"): pruning by the engine's memory formula, the largest micro-batch that fits (predicted,
// then confirmed by running it), DeepSpeed's micro-batch list, and (fast: false) the stage's ZeRO
// knobs. Every experiment is this launcher run again on the user's program with one config; its
// files go to exps_dir/<name>/, the summary and the best config to results_dir. `run` then starts
// the job with the best config. docs/autotuning.md has the flow and the files.
#pragma once

#include <string>
#include <vector>

#include "host_info.h"
#include "launch_plan.h"

namespace deepspeed::launcher {

struct AutotuneRequest {
  std::string mode;                          // "tune" or "run"
  LauncherOptions options;                   // the parsed command line
  std::vector<std::string> launcher_flags;   // the user's flags before PROGRAM, --autotuning removed
  int ranks = 1;                             // ranks of each experiment (the job's world size)
  int ranks_per_host = 1;
  std::string launcher_path;                 // this executable
};

/// Tunes and (mode "run") launches. Returns the exit status: 0 when tuning found a config (and,
/// for "run", the job succeeded), 1 when no experiment ran successfully.
int run_autotuning(const AutotuneRequest& request);

/// The ranks of each experiment and the most on one host: the hostfile's selected slots, else
/// --num_gpus, else this machine's GPUs, else 1.
std::pair<int, int> autotuning_world(const LauncherOptions& options, const HostInfo& host);

/// This executable's path (/proc/self/exe), to run the experiments with.
std::string self_executable_path();

/// The request's flags: `args` (the launcher's argv without argv[0]) up to PROGRAM without
/// --autotuning and its value; `program_arg_count` = number of words from PROGRAM on.
std::vector<std::string> launcher_flags_without_autotuning(const std::vector<std::string>& args,
                                                           size_t program_arg_count);

}  // namespace deepspeed::launcher

// LaunchPlan: what to start on this machine, derived purely from the launcher's options and a
// HostInfo: how many ranks, each rank's argv, the environment DeepSpeed's per-node launcher
// (launch.py) sets, and core binding. No I/O here; local_runner.h executes a plan.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "host_info.h"

namespace deepspeed::launcher {

inline constexpr int kDefaultMasterPort = 29500;                 // DeepSpeed's --master_port
inline constexpr const char* kDefaultMasterAddr = "127.0.0.1";  // DeepSpeed's single-node address

// The accepted runner flags, after CLI parsing (cli.h). Names follow DeepSpeed's runner.py.
struct LauncherOptions {
  int num_gpus = -1;                 // --num_gpus/--num_accelerators; -1 = derive from the machine
  std::string master_addr = kDefaultMasterAddr;  // --master_addr
  int master_port = kDefaultMasterPort;          // --master_port
  bool no_local_rank = false;        // --no_local_rank: do not append --local_rank=<LOCAL_RANK>
  bool no_python = false;            // --no_python: accepted no-op, PROGRAM is always executed
  bool save_pid = false;             // --save_pid: write the launcher pid to /tmp/<pid>.deepspeed
  std::string enable_each_rank_log;  // --enable_each_rank_log DIR; "" = off
  bool bind_cores_to_rank = false;   // --bind_cores_to_rank
  std::string bind_core_list;        // --bind_core_list "0,2-5"; "" = the launcher's cores
  std::string log_level = "info";    // --log_level
  bool quiet = false;                // -q/--quiet: only warnings and errors from the launcher
  std::string program;               // PROGRAM: the first positional argument
  std::vector<std::string> program_args;  // everything after PROGRAM, untouched
};

using EnvVar = std::pair<std::string, std::string>;

struct RankLaunch {
  int rank = 0;        // global rank (== local rank on one machine)
  int local_rank = 0;
  std::vector<std::string> argv;  // argv[0] is PROGRAM as the user wrote it
  std::vector<EnvVar> env;        // set on top of the launcher's own environment, in this order
  std::vector<int> cpu_cores;     // sched_setaffinity mask; empty = inherit the launcher's
};

struct LaunchPlan {
  std::string program_path;  // what to exec(); filled by resolve_program() (program_path.h)
  int world_size = 0;
  std::string master_addr;
  int master_port = 0;
  std::vector<std::string> cuda_visible_devices;  // devices given to the ranks; empty = untouched
  std::vector<RankLaunch> ranks;
  std::vector<std::string> warnings;  // for the launcher to print; the plan is still usable

  // One line for the launcher's info message: rank count, program, master, devices, binding.
  std::string summary() const;
};

// Builds the plan. Throws UsageError (exit 2, nothing started) naming the flag when:
// --num_gpus is 0 or below -1; --master_port is outside 1..65535; --master_addr is empty; GPUs are
// present and more ranks are asked for than CUDA_VISIBLE_DEVICES lists; --bind_cores_to_rank has
// fewer cores than ranks or --bind_core_list names a core the launcher may not use.
//
// Rank count: --num_gpus if given; else the number of CUDA_VISIBLE_DEVICES entries if set; else the
// number of GPUs present; else 1. When GPUs are present, the ranks get CUDA_VISIBLE_DEVICES = the
// first N entries of the launcher's list, or 0..N-1 (as launch.py sets it to the node's slots).
LaunchPlan make_launch_plan(const LauncherOptions& options, const HostInfo& host);

// Splits a CUDA_VISIBLE_DEVICES value at commas, trimming blanks and dropping empty entries.
std::vector<std::string> split_device_list(const std::string& value);

}  // namespace deepspeed::launcher

// LaunchPlan: what to start on this machine, derived purely from the launcher's options and a
// HostInfo: how many ranks, each rank's argv, the environment DeepSpeed's per-node launcher
// (launch.py) sets, and core binding. Two sources: this machine alone (make_launch_plan) or one
// node of a multi-host WorldInfo (make_node_plan). No I/O here; local_runner.h executes a plan.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "host_info.h"
#include "hostfile.h"
#include "world_info.h"

namespace deepspeed::launcher {

inline constexpr int kDefaultMasterPort = 29500;                 // DeepSpeed's --master_port
inline constexpr const char* kLocalMasterAddr = "127.0.0.1";    // DeepSpeed's single-node address

// The accepted runner flags, after CLI parsing (cli.h). Names and defaults follow DeepSpeed's
// runner.py (and launch.py for the per-node ones).
struct LauncherOptions {
  int num_gpus = -1;                 // --num_gpus/--num_accelerators; -1 = derive from the machine
  // --master_addr; "" = 127.0.0.1 on one machine, across machines the first address
  // `hostname -I` prints on the first host (DeepSpeed's default).
  std::string master_addr;
  int master_port = kDefaultMasterPort;  // --master_port
  bool no_local_rank = false;        // --no_local_rank: do not append --local_rank=<LOCAL_RANK>
  bool no_python = false;            // --no_python: accepted no-op, PROGRAM is always executed
  bool save_pid = false;             // --save_pid: write the launcher pid to /tmp/<pid>.deepspeed
  std::string enable_each_rank_log;  // --enable_each_rank_log DIR; "" = off
  bool bind_cores_to_rank = false;   // --bind_cores_to_rank
  std::string bind_core_list;        // --bind_core_list "0,2-5"; "" = the launcher's cores
  std::string log_level = "info";    // --log_level
  bool quiet = false;                // -q/--quiet: only warnings and errors from the launcher

  // Multi-node (see docs/launcher.md).
  std::string hostfile = kDefaultHostfile;  // -H/--hostfile
  bool hostfile_given = false;       // -H/--hostfile was on the command line
  std::string include;               // -i/--include NODE_SPEC[@NODE_SPEC...]
  std::string exclude;               // -e/--exclude
  int num_nodes = -1;                // --num_nodes: the first N hosts; -1 = all
  std::string launcher = "pdsh";     // --launcher: pdsh (ssh fan-out), openmpi, slurm; lower-cased
  std::string launcher_args;         // --launcher_args: extra words for ssh / mpirun / srun
  int ssh_port = -1;                 // --ssh_port; -1 = ssh's own default
  bool force_multi = false;          // --force_multi: the multi-node path even for one host
  bool no_ssh = false;               // --no_ssh: start only this host's ranks (needs --node_rank)
  bool no_ssh_check = false;         // --no_ssh_check: skip the passwordless-ssh check
  int node_rank = -1;                // --node_rank: this host's index with --no_ssh / per-node mode
  std::string venv_script;           // --venv_script: sourced on each host before its launcher

  // Per-node mode: what the launcher runs on each host (like DeepSpeed's launch.py).
  std::string world_info;            // --world_info=<base64 JSON>; non-empty = per-node mode
  bool stop_on_stdin_eof = false;    // --stop_on_stdin_eof: see Note [Stdin lifeline] in local_runner.h

  std::string autotuning;            // --autotuning tune|run; "" = off (docs/autotuning.md)

  std::string program;               // PROGRAM: the first positional argument
  std::vector<std::string> program_args;  // everything after PROGRAM, untouched
};

struct RankLaunch {
  int rank = 0;        // global rank
  int local_rank = 0;  // index on this host
  std::vector<std::string> argv;  // argv[0] is PROGRAM as the user wrote it
  std::vector<EnvVar> env;        // set on top of the launcher's own environment, in this order
  std::vector<int> cpu_cores;     // sched_setaffinity mask; empty = inherit the launcher's
};

struct LaunchPlan {
  std::string program_path;  // what to exec(); filled by resolve_program() (program_path.h)
  int world_size = 0;
  int node_rank = 0;         // CROSS_RANK: this host's index in the job
  int node_count = 1;        // CROSS_SIZE
  std::string master_addr;
  int master_port = 0;
  std::vector<std::string> cuda_visible_devices;  // devices given to the ranks; empty = untouched
  std::vector<RankLaunch> ranks;                  // this host's ranks only
  std::vector<std::string> warnings;  // for the launcher to print; the plan is still usable

  // One line for the launcher's info message: rank count, program, master, devices, binding.
  std::string summary() const;
};

// The plan for this machine alone (no hostfile). Throws UsageError (exit 2, nothing started)
// naming the flag when: --num_gpus is 0 or below -1; --master_port is outside 1..65535; GPUs are
// present and more ranks are asked for than CUDA_VISIBLE_DEVICES lists; --bind_cores_to_rank has
// fewer cores than ranks or --bind_core_list names a core the launcher may not use.
//
// Rank count: --num_gpus if given; else the number of CUDA_VISIBLE_DEVICES entries if set; else the
// number of GPUs present; else 1. When GPUs are present, the ranks get CUDA_VISIBLE_DEVICES = the
// first N entries of the launcher's list, or 0..N-1 (as launch.py sets it to the node's slots).
// An empty --master_addr means 127.0.0.1.
LaunchPlan make_launch_plan(const LauncherOptions& options, const HostInfo& host);

// The plan for host `node_rank` of `world` (DeepSpeed's launch.py): its ranks are numbered after
// the slots of the hosts before it; LOCAL_RANK is the index on this host; CUDA_VISIBLE_DEVICES is
// this host's slot list when it has GPUs. options.master_addr must be set. Throws UsageError for a
// node_rank outside the world, an empty --master_addr, a bad --master_port and the core-binding
// errors above.
LaunchPlan make_node_plan(const LauncherOptions& options, const WorldInfo& world, int node_rank,
                          const HostInfo& host);

// Splits a CUDA_VISIBLE_DEVICES value at commas, trimming blanks and dropping empty entries.
std::vector<std::string> split_device_list(const std::string& value);

}  // namespace deepspeed::launcher

// launch(): the launcher's decision tree, DeepSpeed runner.py's main() — per-node mode (started by a
// controller on each host), this machine alone, one host of a hostfile, --no_ssh, or a multi-node
// launch — and the run itself. main() only parses the command line and maps exceptions to exit
// codes.
#pragma once

#include "host_info.h"
#include "launch_plan.h"

namespace deepspeed::launcher {

// Runs the job the options describe on `host` and returns the launcher's exit status. Throws
// UsageError for anything wrong before a rank starts (exit 2) and std::exception for failures to
// start processes (exit 1).
//
// Paths, in order:
//   --world_info given       per-node mode: this host's ranks of that world (--node_rank);
//   no hostfile              this machine: --num_gpus / CUDA_VISIBLE_DEVICES / GPUs (or, with
//                            --include/--exclude, the pool localhost:<GPUs>);
//   hostfile, --no_ssh       only host --node_rank's ranks, here;
//   hostfile, one host and   that host's slots, here (as DeepSpeed, even if it names another
//     no --force_multi       machine);
//   otherwise                across the hosts: ssh (pdsh), mpirun (openmpi) or srun (slurm).
int launch(const LauncherOptions& options, const HostInfo& host);

}  // namespace deepspeed::launcher

// run_multinode(): a launch across hosts from this machine (the controller). Resolves the master
// address and checks passwordless ssh as DeepSpeed's runner does, then either starts one ssh per
// host running that host's per-node launcher (--launcher pdsh) and watches them all, or hands the
// job to mpirun (openmpi, mpich, impi, mvapich) or srun (slurm). See docs/launcher.md for the
// failure semantics.
#pragma once

#include "host_info.h"
#include "hostfile.h"
#include "launch_plan.h"
#include "world_info.h"

namespace deepspeed::launcher {

// Seconds the controller gives a host, after asking it to stop, beyond the host's own SIGKILL
// grace, before it kills the ssh (which also ends the remote launcher via its lifeline).
inline constexpr double kRemoteStopMarginSeconds = 10.0;

// Runs the job on `world` and returns the launcher's exit status: 0; the status of the first host
// (or of mpirun/srun) that failed; or 1 when the launcher was signalled. Throws UsageError
// (nothing started) when the backend is not installed, the first host is not reachable by ssh,
// or its address cannot be found; and the errors of validate_multinode_options().
int run_multinode(const LauncherOptions& options, const WorldInfo& world, const ResourcePool& pool,
                  const HostInfo& host, double kill_grace_s);

}  // namespace deepspeed::launcher

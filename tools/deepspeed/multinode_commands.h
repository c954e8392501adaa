// The commands of a multi-node launch, built purely from the options and resources (DeepSpeed's
// multinode_runner.py): the per-node launcher command line each host runs, the ssh that starts
// it (--launcher pdsh: one ssh per host, which is what pdsh -R ssh does), and the mpirun
// (--launcher openmpi, mpich, impi, mvapich) and srun (--launcher slurm) command lines.
// multinode_runner.h runs them.
#pragma once

#include <string>
#include <vector>

#include "host_info.h"
#include "hostfile.h"
#include "launch_plan.h"
#include "world_info.h"

namespace deepspeed::launcher {

// Backends of --launcher (lower-cased). DeepSpeed's jsrun is refused.
inline constexpr const char* kPdshLauncher = "pdsh";
inline constexpr const char* kOpenMpiLauncher = "openmpi";
inline constexpr const char* kSlurmLauncher = "slurm";
inline constexpr const char* kMpichLauncher = "mpich";
inline constexpr const char* kImpiLauncher = "impi";
inline constexpr const char* kMvapichLauncher = "mvapich";

// Whether `launcher` starts the ranks with an MPI's mpirun (openmpi, mpich, impi, mvapich).
bool is_mpirun_launcher(const std::string& launcher);

struct MultiNodeJob {
  LauncherOptions options;      // the flags (launcher lower-cased)
  WorldInfo world;              // the active resources, in rank order
  ResourcePool pool;            // the hostfile as read (openmpi counts its slots, as DeepSpeed)
  std::string master_addr;      // resolved: --master_addr or the first host's address
  std::vector<EnvVar> exports;  // collect_exports(): what every host's ranks must see
  std::string launcher_path;    // this executable: run on every host in per-node mode
  std::string cwd;              // every host cd's here first (hosts share the file system)
};

// Throws UsageError for a --launcher other than pdsh, openmpi, slurm, mpich, impi and mvapich
// (lower-case), naming the supported ones; DeepSpeed's jsrun is refused by name.
void validate_launcher_name(const std::string& launcher);

// Checks that the flags suit the chosen backend, before anything runs. Throws UsageError for an
// unknown or unsupported --launcher (naming the supported ones), and for flags the backend cannot
// honour: the MPI backends reject --include/--exclude/--num_nodes/--num_gpus (as DeepSpeed) and,
// like slurm, --bind_cores_to_rank, --enable_each_rank_log and --venv_script (their ranks start
// without our per-node launcher).
void validate_multinode_options(const LauncherOptions& options);

// The per-node launcher for host `node_rank`: <launcher> --world_info=... --node_rank=N
// --master_addr=A --master_port=P --stop_on_stdin_eof [per-node flags] -- PROGRAM ARGS.
std::vector<std::string> node_launcher_argv(const MultiNodeJob& job, int node_rank);

// What ssh runs on host `node_rank`: [. VENV &&] cd CWD && export K=V ... && exec <node launcher>,
// every word quoted for a POSIX shell.
std::string remote_shell_command(const MultiNodeJob& job, int node_rank);

// ssh [launcher_args] -T -x -a -o BatchMode=yes -o ServerAliveInterval=10 -o ServerAliveCountMax=3
// [-p PORT] HOST <remote_shell_command>. launcher_args come first so that the user's -o wins
// (ssh keeps the first value it sees for an option).
std::vector<std::string> ssh_argv(const MultiNodeJob& job, int node_rank);

// ssh to `host` running `command` (the passwordless check and `hostname -I`): with -p and, for the
// pdsh launcher, the launcher_args, which are ssh options there. Never prompts for a password.
std::vector<std::string> ssh_probe_argv(const LauncherOptions& options, const std::string& host,
                                        const std::vector<std::string>& command);

// mpirun -n <hostfile slots> -hostfile <hostfile> --mca btl ^openib
//   [--mca btl_tcp_if_include eth0 unless launcher_args set it] <launcher_args>
//   -x UCX_TLS=tcp -x K=V ... -x MASTER_ADDR=A -x MASTER_PORT=P PROGRAM ARGS
// Ranks take RANK/LOCAL_RANK/WORLD_SIZE from Open MPI's OMPI_COMM_WORLD_* (src/util/env.cpp).
std::vector<std::string> mpirun_argv(const MultiNodeJob& job);

// DeepSpeed's MPICHRunner: mpirun -n <slots> -ppn <slots per host> <launcher_args>
//   -genv K V ... -genv MASTER_ADDR A -genv MASTER_PORT P -genv WORLD_SIZE N -genv LOCAL_SIZE L
//   -hosts H1,H2 PROGRAM ARGS
// Ranks take RANK/LOCAL_RANK from Hydra's PMI_RANK/MPI_LOCALRANKID (src/util/env.cpp). Throws
// UsageError when the hostfile's hosts have different slot counts (-ppn is one number).
std::vector<std::string> mpich_argv(const MultiNodeJob& job);

// DeepSpeed's IMPIRunner: mpirun -ppn <slots per host> <launcher_args> -genv K V ...
//   -genv MASTER_ADDR A -genv MASTER_PORT P -genv WORLD_SIZE N -genv LOCAL_SIZE L -genv I_MPI_PIN 0
//   -hosts H1,H2 -n 1 -env RANK 0 -env LOCAL_RANK 0 PROGRAM ARGS : -n 1 -env RANK 1 ... (one
// MPMD section a rank). Equal slot counts required, as for mpich.
std::vector<std::string> impi_argv(const MultiNodeJob& job);

// DeepSpeed's MVAPICHRunner: mpirun -np <slots> -ppn <slots per host> --hostfile <hosts_file>
//   <launcher_args> -env K=V ... PROGRAM ARGS, its MV2_* tuning exports first (CMA off, backtraces,
//   DL support, affinity off, allgather tuning) and MASTER_ADDR/MASTER_PORT last. `hosts_file`
// lists one host a line (mvapich_hosts_file_text). Ranks take RANK/LOCAL_RANK/WORLD_SIZE from
// MV2_COMM_WORLD_*. Equal slot counts required, as for mpich.
std::vector<std::string> mvapich_argv(const MultiNodeJob& job, const std::string& hosts_file);
std::string mvapich_hosts_file_text(const MultiNodeJob& job);

// srun -n <ranks> <launcher_args> [--nodelist=H1,H2 for --include] [--exclude=H for --exclude]
//   [--nodes=N for --num_nodes] [--ntasks-per-node=G for --num_gpus]
//   --export=ALL,K=V,...,MASTER_ADDR=A,MASTER_PORT=P PROGRAM ARGS
// Ranks take theirs from SLURM_PROCID/SLURM_LOCALID/SLURM_STEP_NUM_TASKS. Throws UsageError for
// an --include/--exclude that names slots (Slurm places tasks on whole nodes) and for an exported
// value containing ',' (srun's --export list cannot carry it).
std::vector<std::string> srun_argv(const MultiNodeJob& job);

}  // namespace deepspeed::launcher

// HostInfo: what the launcher reads from this machine and its own environment (visible GPUs, CPU
// cores, PATH, the environment and .deepspeed_env files a multi-node launch exports,
// DS_LAUNCHER_KILL_GRACE_S). The single place the launcher calls getenv(), so the plan stays a pure
// function of (flags, HostInfo) and tests can feed any machine they like.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepspeed::launcher {

using EnvVar = std::pair<std::string, std::string>;

inline constexpr double kDefaultKillGraceSeconds = 30.0;  // DeepSpeed's launch.py waits 30 s

struct HostInfo {
  // The launcher's CUDA_VISIBLE_DEVICES; nullopt when unset or empty (DeepSpeed treats "" as unset).
  std::optional<std::string> cuda_visible_devices;
  // NVIDIA GPUs present (device nodes /dev/nvidiaN, else /proc/driver/nvidia/gpus); 0 on a
  // CPU-only machine, where --num_gpus counts processes and CUDA_VISIBLE_DEVICES is left alone.
  int gpu_count = 0;
  // CPUs in the launcher's affinity mask, ascending: what --bind_cores_to_rank splits by default.
  std::vector<int> available_cores;
  // PATH, for finding a PROGRAM given without a '/'.
  std::string path_env;
  // The launcher's whole environment, in environ order (multi-node exports pick from it).
  std::vector<EnvVar> environment;
  // The current directory (remote hosts cd into it) and the launcher's own executable (what runs
  // on each host in per-node mode; hosts share the path, as with DeepSpeed's python -m).
  std::string cwd;
  std::string self_exe;
  // The .deepspeed_env files that exist, as (path, contents): $HOME's first, then the current
  // directory's, as DeepSpeed reads them (later lines win). The name is $DS_ENV_FILE if set.
  std::vector<std::pair<std::string, std::string>> deepspeed_env_files;
};

// Reads the running machine and environment.
HostInfo detect_host_info();

// Seconds between forwarding SIGTERM/SIGINT and sending SIGKILL: DS_LAUNCHER_KILL_GRACE_S if set
// (tests shorten it), else kDefaultKillGraceSeconds. Throws UsageError if the variable is not a
// non-negative number.
double kill_grace_seconds_from_env();

// The first PATH entry holding an executable file `name` (ssh, mpirun, srun); nullopt if none.
std::optional<std::string> find_on_path(const std::string& name, const std::string& path_env);

}  // namespace deepspeed::launcher

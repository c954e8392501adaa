// HostInfo: what the launcher reads from this machine and its own environment (visible GPUs, CPU
// cores, PATH, DS_LAUNCHER_KILL_GRACE_S). The single place the launcher calls getenv(), so the
// plan stays a pure function of (flags, HostInfo) and tests can feed any machine they like.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace deepspeed::launcher {

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
};

// Reads the running machine and environment.
HostInfo detect_host_info();

// Seconds between forwarding SIGTERM/SIGINT and sending SIGKILL: DS_LAUNCHER_KILL_GRACE_S if set
// (tests shorten it), else kDefaultKillGraceSeconds. Throws UsageError if the variable is not a
// non-negative number.
double kill_grace_seconds_from_env();

}  // namespace deepspeed::launcher

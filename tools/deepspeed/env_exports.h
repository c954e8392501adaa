// The environment a multi-node launch carries to every host (DeepSpeed runner.py): variables of the
// launcher's environment whose names start with an exported prefix, PYTHONPATH with the current
// directory in front, and the NAME=VALUE lines of `.deepspeed_env` files. The local (one-machine)
// launch needs none of this: its ranks inherit the launcher's environment. Pure; HostInfo reads
// the environment and the files.
#pragma once

#include <string>
#include <vector>

#include "host_info.h"

namespace deepspeed::launcher {

// DeepSpeed's EXPORT_ENVS (MLFLOW, PYTHON, MV2, UCX), its CUDA accelerator's (NCCL) and Nebula's,
// plus what deepspeed-cpp's own ranks read: GLOO_ (GLOO_SOCKET_IFNAME), OMP_ (OpenMP threads),
// DEEPSPEED_ (DEEPSPEED_TIMEOUT) and DS_ (DS_LAUNCHER_KILL_GRACE_S, DS_CPU_ADAM_SIMD, ...), and
// the CPU math libraries' settings (OPENBLAS_, MKL_, ONEDNN_, DNNL_): OPENBLAS_CORETYPE picks the
// GEMM kernels, so a host whose login environment lacks it computes other roundings (and speeds)
// than the launching host.
inline constexpr const char* kExportedPrefixes[] = {
    "MLFLOW", "PYTHON",     "MV2", "UCX",      "NCCL",    "NEBULA", "GLOO_",
    "OMP_",   "DEEPSPEED_", "DS_", "OPENBLAS_", "MKL_",   "ONEDNN_", "DNNL_"};

// Parses a .deepspeed_env file: each line NAME=VALUE, split at the first '=', both sides trimmed
// (DeepSpeed's format). Blank lines and lines starting with '#' are skipped (DeepSpeed would fail
// on them). Throws UsageError naming the file and line for a line without '=' or a NAME that is
// not a shell variable name ([A-Za-z_][A-Za-z0-9_]*).
std::vector<EnvVar> parse_deepspeed_env(const std::string& text, const std::string& path);

// Sets `name` to `value` in `vars`, replacing an earlier value in place (later sources win).
void set_var(std::vector<EnvVar>& vars, const std::string& name, const std::string& value);

// The exports of a multi-node launch, in DeepSpeed's order: matching variables of `host.environment`
// (PYTHONPATH becomes "<cwd>:<PYTHONPATH>", or "<cwd>" when unset), then each of
// host.deepspeed_env_files (home first, then the current directory), later values winning.
// Throws UsageError from parse_deepspeed_env.
std::vector<EnvVar> collect_exports(const HostInfo& host);

}  // namespace deepspeed::launcher

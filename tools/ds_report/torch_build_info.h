// What LibTorch was built with, read from at::show_config()'s text (the same text Python's
// torch.__config__.show() prints): versions of CUDA and cuDNN, the CPU capability ATen dispatches
// to, and the "Build settings:" key=value list (USE_CUDA, USE_NCCL, USE_MPI, BLAS_INFO, ...).
#pragma once

#include <map>
#include <string>

namespace deepspeed::report {

struct TorchBuildInfo {
  std::string cuda_runtime;    // "11.7" from "CUDA Runtime 11.7"; "" when built without CUDA
  std::string cudnn;           // "8.5" from "CuDNN 8.5"; ""
  std::string cpu_capability;  // "AVX2" from "CPU capability usage: AVX2"; ""
  std::map<std::string, std::string> settings;  // "USE_NCCL" -> "OFF", ...

  // settings[key] or `fallback` when the key is absent.
  std::string setting(const std::string& key, const std::string& fallback = "?") const;
};

// Parses show_config() text; unknown lines are ignored, so a newer LibTorch only adds rows.
TorchBuildInfo parse_show_config(const std::string& text);

}  // namespace deepspeed::report

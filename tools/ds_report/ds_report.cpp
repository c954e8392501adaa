// ds_report: DeepSpeed's environment report for deepspeed-cpp — which ops are built and which
// CPU-Adam path will run, the LibTorch build (CUDA, cuDNN, NCCL, Gloo, MPI), the GPUs and CPU
// this process sees, and this library's version and compiled features, as DeepSpeed's
// `ds_report` lays them out ("name ....... value"). Flags as DeepSpeed's:
// --hide_operator_status, --hide_errors_and_warnings.
#include <dlfcn.h>
#include <sys/statvfs.h>

#include <ATen/Parallel.h>
#include <ATen/Version.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "deepspeed/version.h"
#include "ops/cpu_adam/cpu_adam.h"
#include "runtime/openblas_core.h"
#include "torch_build_info.h"

namespace {

using deepspeed::report::TorchBuildInfo;

constexpr int kNameWidth = 33;  // DeepSpeed pads names with dots to this column
constexpr double kMinShmBytes = 512.0 * 1024 * 1024;  // DeepSpeed warns below 512 MB
const std::string kRule(50, '-');

void row(const std::string& name, const std::string& value) {
  std::string dots = name.size() + 2 < kNameWidth ? " " + std::string(kNameWidth - name.size() - 2, '.') + " " : " ";
  std::printf("%s%s%s\n", name.c_str(), dots.c_str(), value.c_str());
}

std::string yes_no(bool b) { return b ? "[YES]" : "[NO]"; }

std::string library_path_of(const void* symbol) {
  Dl_info info{};
  if (::dladdr(symbol, &info) == 0 || info.dli_fname == nullptr) return "unknown";
  return info.dli_fname;
}

std::string own_path() {
  char buffer[4096];
  ssize_t n = ::readlink("/proc/self/exe", buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, static_cast<std::size_t>(n)) : "unknown";
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown";
}

std::string cpu_extensions() {
  __builtin_cpu_init();
  std::string out;
  auto add = [&](bool has, const char* name) {
    if (!has) return;
    if (!out.empty()) out += " ";
    out += name;
  };
  add(__builtin_cpu_supports("sse4.2"), "sse4.2");
  add(__builtin_cpu_supports("avx"), "avx");
  add(__builtin_cpu_supports("avx2"), "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  add(__builtin_cpu_supports("avx512f"), "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512vl"), "avx512vl");
  return out.empty() ? "none" : out;
}


std::string megabytes(double bytes) {
  char buffer[32];
  if (bytes >= 1024.0 * 1024 * 1024) {
    std::snprintf(buffer, sizeof(buffer), "%.2f GB", bytes / (1024.0 * 1024 * 1024));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.0f MB", bytes / (1024.0 * 1024));
  }
  return buffer;
}

bool setting_on(const TorchBuildInfo& torch, const std::string& key) {
  std::string v = torch.setting(key, "OFF");
  return v == "ON" || v == "1";
}

int report(int argc, char** argv) {
  namespace ops = deepspeed::ops;
  bool hide_operator_status = false;
  bool hide_errors_and_warnings = false;
  CLI::App app{"deepspeed-cpp environment report (DeepSpeed's ds_report)", "ds_report"};
  app.add_flag("--hide_operator_status", hide_operator_status, "Suppress the op report");
  app.add_flag("--hide_errors_and_warnings", hide_errors_and_warnings, "Suppress the warnings");
  bool openblas_core_only = false;
  app.add_flag("--openblas_core", openblas_core_only,
               "Print only the OpenBLAS kernels this library runs here (empty without OpenBLAS); "
               "the benches pin their Python peers to them");
  CLI11_PARSE(app, argc, argv);
  const deepspeed::runtime::OpenBlasCore& blas_core = deepspeed::runtime::openblas_core();
  if (openblas_core_only) {
    std::printf("%s\n", blas_core.selected.c_str());
    return 0;
  }

  const TorchBuildInfo torch_build = deepspeed::report::parse_show_config(at::show_config());
  const ops::SimdLevel best_simd = ops::detect_simd_level();
  const ops::SimdLevel used_simd = ops::default_simd_level();
  std::vector<std::string> warnings;

  if (!hide_operator_status) {
    std::printf("%s\nDeepSpeed C++/CUDA extension op report\n%s\n", kRule.c_str(), kRule.c_str());
    std::printf("NOTE: deepspeed-cpp builds its ops with the library (CMake); nothing is\n"
                "      compiled just-in-time, so 'installed' is what this build contains.\n%s\n",
                kRule.c_str());
    std::printf("op name ................ installed .. compatible\n%s\n", kRule.c_str());
    std::printf("cpu_adam ............... [YES] ...... [OKAY]    (runs the %s path)\n", ops::simd_level_name(used_simd));
#ifdef DS_WITH_NCCL
    std::printf("nccl collectives ....... [YES] ...... %s\n", torch::cuda::is_available() ? "[OKAY]" : "[NO]");
#else
    std::printf("nccl collectives ....... [NO] ....... [NO]      (build with -DDS_BUILD_CUDA=ON)\n");
#endif
    std::printf("gloo collectives ....... [YES] ...... [OKAY]\n%s\n", kRule.c_str());
  }

  std::printf("DeepSpeed general environment info:\n");
  row("deepspeed-cpp version", std::string(deepspeed::kVersion) + " (follows DeepSpeed " +
                                   deepspeed::kDeepSpeedCompatVersion + ")");
  row("deepspeed-cpp install path", own_path());
#ifdef DS_WITH_NCCL
  const bool built_nccl = true;
#else
  const bool built_nccl = false;
#endif
  row("deepspeed-cpp compiled w.", std::string("torch ") + TORCH_VERSION + ", CUDA " + (built_nccl ? "yes" : "no") +
                                       ", NCCL " + (built_nccl ? "yes" : "no") + ", Gloo yes, cpu_adam up to " +
                                       ops::simd_level_name(best_simd));
  row("torch install path", library_path_of(reinterpret_cast<const void*>(&at::show_config)));
  row("torch version", torch_build.setting("TORCH_VERSION", TORCH_VERSION));
  row("torch cuda version", torch_build.cuda_runtime.empty() ? "None (CPU-only LibTorch)" : torch_build.cuda_runtime);
  row("torch cudnn version", torch_build.cudnn.empty() ? "None" : torch_build.cudnn);
  row("torch distributed backends", "gloo [YES], nccl " + yes_no(setting_on(torch_build, "USE_NCCL")) + ", mpi " +
                                        yes_no(setting_on(torch_build, "USE_MPI")));
  row("torch BLAS", torch_build.setting("BLAS_INFO"));
  if (!blas_core.selected.empty()) {
    row("OpenBLAS kernels", blas_core.selected + " (" + blas_core.note + ")");
  }
  row("torch CPU capability", torch_build.cpu_capability.empty() ? "unknown" : torch_build.cpu_capability);
  const bool cuda = torch::cuda::is_available();
  row("GPUs visible", std::to_string(cuda ? torch::cuda::device_count() : 0) + " (CUDA available: " +
                          (cuda ? "yes" : "no") + ")");
  row("CPU", cpu_model() + ", " + std::to_string(std::thread::hardware_concurrency()) + " logical CPUs");
  row("CPU vector extensions", cpu_extensions());
  row("CPU-Adam path", std::string(ops::simd_level_name(used_simd)) + " (best here: " +
                           ops::simd_level_name(best_simd) + "; DS_CPU_ADAM_SIMD can lower it)");
  row("OpenMP threads", std::to_string(at::get_num_threads()));
  struct statvfs shm{};
  if (::statvfs("/dev/shm", &shm) == 0) {
    const double bytes = static_cast<double>(shm.f_blocks) * static_cast<double>(shm.f_frsize);
    row("shared memory (/dev/shm) size", megabytes(bytes));
    if (bytes < kMinShmBytes) {
      warnings.push_back("/dev/shm is " + megabytes(bytes) + ", below the 512 MB DeepSpeed recommends; "
                         "data loaders and NCCL may fail (docker: --shm-size)");
    }
  } else {
    row("shared memory (/dev/shm) size", "unavailable");
  }

  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && best_simd < ops::SimdLevel::kAvx512) {
    warnings.push_back("this CPU has AVX-512 but cpu_adam was built without it; rebuild with a compiler that "
                       "accepts -mavx512f for the faster path");
  } else if (__builtin_cpu_supports("avx2") && best_simd < ops::SimdLevel::kAvx2) {
    warnings.push_back("this CPU has AVX2 but cpu_adam was built without it");
  }
  if (used_simd < best_simd) {
    warnings.push_back(std::string("DS_CPU_ADAM_SIMD lowers cpu_adam to the ") + ops::simd_level_name(used_simd) +
                       " path");
  }
  if (!hide_errors_and_warnings) {
    for (const std::string& w : warnings) std::printf("[WARNING] %s\n", w.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return report(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds_report: error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "ds_report: error: unknown exception (a bug in deepspeed-cpp)\n");
    return 1;
  }
}

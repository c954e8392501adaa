// OpenBlasCore implementation: a static initializer that re-selects OpenBLAS's kernels.
#include "runtime/openblas_core.h"

#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <string_view>

namespace deepspeed::runtime {
namespace {

// OpenBLAS's x86-64 generic cores: what get_coretype() falls back to for a CPU model the
// release does not know, or that it detects as such. None uses AVX2.
constexpr std::array<std::string_view, 12> kGenericCores = {
    "Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
    "Atom",    "Core2",  "Penryn",     "Dunnington", "Nehalem", "Sandybridge"};

// The SkylakeX kernels need AVX-512 F/CD/BW/DQ/VL; GCC's check includes the OS's XCR0 state.
bool cpu_has_avx512_kernels() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

bool cpu_has_avx2_fma_kernels() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

template <typename Fn>
Fn openblas_symbol(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_DEFAULT, name));
}

OpenBlasCore select_openblas_core() {
  __builtin_cpu_init();  // this runs as a constructor, possibly before libgcc's own
  OpenBlasCore core;
  using CoreNameFn = char* (*)();
  using InitFn = void (*)();
  auto corename = openblas_symbol<CoreNameFn>("openblas_get_corename");
  if (corename == nullptr) {
    core.note = "no OpenBLAS in this process";
    return core;
  }
  core.detected = core.selected = corename();
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr) {
    core.note = std::string("OPENBLAS_CORETYPE=") + forced + " is set";
    return core;
  }
  const std::string upgrade =
      openblas_core_upgrade(core.detected, cpu_has_avx512_kernels(), cpu_has_avx2_fma_kernels());
  if (upgrade.empty()) {
    core.note = "OpenBLAS's own choice";
    return core;
  }
  auto quit = openblas_symbol<InitFn>("gotoblas_dynamic_quit");
  auto init = openblas_symbol<InitFn>("gotoblas_dynamic_init");
  if (quit == nullptr || init == nullptr) {
    core.note = "a single-target OpenBLAS; " + upgrade + " kernels would suit this CPU";
    return core;
  }
  // gotoblas_dynamic_init() reads OPENBLAS_CORETYPE; the variable stays set for child processes.
  ::setenv("OPENBLAS_CORETYPE", upgrade.c_str(), /*overwrite=*/0);
  quit();
  init();
  core.selected = corename();
  core.note = "OpenBLAS fell back to " + core.detected +
              " on this CPU, deepspeed-cpp selected these; OPENBLAS_CORETYPE chooses";
  return core;
}

// Runs during static initialization, after the shared libraries' constructors (OpenBLAS's
// included) and before main(): no GEMM has run yet with the fallback kernels.
const OpenBlasCore g_core = select_openblas_core();

}  // namespace

std::string openblas_core_upgrade(const std::string& detected, bool avx512_kernels,
                                  bool avx2_fma_kernels) {
  bool generic = false;
  for (std::string_view name : kGenericCores) generic = generic || detected == name;
  if (!generic) return "";
  if (avx512_kernels) return "SkylakeX";
  if (avx2_fma_kernels) return "Haswell";
  return "";
}

const OpenBlasCore& openblas_core() { return g_core; }

}  // namespace deepspeed::runtime

// Referenced by the library's link options (src/CMakeLists.txt), so that every program linked
// with the static library keeps this object and its initializer.
extern "C" const void* deepspeed_openblas_core_anchor() {
  return &deepspeed::runtime::openblas_core();
}

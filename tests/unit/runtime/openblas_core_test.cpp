// OpenBlasCore: a process linked with deepspeed-cpp never runs OpenBLAS's generic fallback
// kernels on a CPU that has AVX2 or AVX-512, and a set OPENBLAS_CORETYPE is obeyed. Checked in
// child processes of this test binary, started with the environment under test.
#include "runtime/openblas_core.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

#include "support/run_command.h"

namespace deepspeed::runtime {
namespace {

TEST(OpenBlasCore, ReplacesOnlyGenericFallbacks) {
  EXPECT_EQ(openblas_core_upgrade("Prescott", true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_upgrade("Prescott", false, true), "Haswell");
  EXPECT_EQ(openblas_core_upgrade("Nehalem", false, true), "Haswell");
  EXPECT_EQ(openblas_core_upgrade("Sandybridge", true, true), "SkylakeX");
  EXPECT_EQ(openblas_core_upgrade("Prescott", false, false), "");  // nothing better here
  for (const char* named : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"}) {
    EXPECT_EQ(openblas_core_upgrade(named, true, true), "") << named;
  }
}

// Runs in a child (see Child below): prints what the library did at load.
TEST(OpenBlasCoreChild, DISABLED_Report) {
  const OpenBlasCore& core = openblas_core();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  std::printf("openblas detected=%s\nopenblas selected=%s\nopenblas env=%s\n",
              core.detected.c_str(), core.selected.c_str(), env ? env : "<unset>");
}

std::map<std::string, std::string> child_report(const std::string& env_prefix) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  EXPECT_GT(n, 0);
  self[n > 0 ? n : 0] = '\0';
  const auto result = testing::run_command(
      env_prefix + " '" + self +
      "' --gtest_also_run_disabled_tests --gtest_filter=OpenBlasCoreChild.DISABLED_Report");
  EXPECT_EQ(result.exit_code, 0) << result.out << result.err;
  std::map<std::string, std::string> report;
  std::istringstream lines(result.out);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("openblas ", 0) != 0) continue;
    const auto eq = line.find('=');
    report[line.substr(9, eq - 9)] = line.substr(eq + 1);
  }
  return report;
}

bool cpu_has_avx512_kernels() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl");
}

bool cpu_has_avx2_fma_kernels() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

TEST(OpenBlasCore, NoGenericKernelsWhenUnset) {
  auto report = child_report("env -u OPENBLAS_CORETYPE");
  if (report["detected"].empty()) GTEST_SKIP() << "this LibTorch does not use OpenBLAS";
  // Whatever OpenBLAS detected, the kernels in use are not a fallback this CPU can beat.
  EXPECT_EQ(openblas_core_upgrade(report["selected"], cpu_has_avx512_kernels(),
                                  cpu_has_avx2_fma_kernels()),
            "")
      << "detected " << report["detected"] << ", selected " << report["selected"];
  if (report["selected"] != report["detected"]) {
    // Exported, so that Python references and ranks started from here run the same kernels.
    EXPECT_EQ(report["env"], report["selected"]);
  } else {
    EXPECT_EQ(report["env"], "<unset>");
  }
}

TEST(OpenBlasCore, ObeysOpenBlasCoretype) {
  auto report = child_report("OPENBLAS_CORETYPE=Prescott");
  if (report["detected"].empty()) GTEST_SKIP() << "this LibTorch does not use OpenBLAS";
  EXPECT_EQ(report["selected"], "Prescott");
  EXPECT_EQ(report["env"], "Prescott");
}

}  // namespace
}  // namespace deepspeed::runtime

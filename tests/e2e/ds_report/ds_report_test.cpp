// ds_report (tools/ds_report): it runs and prints every row, with values that agree with what
// this process finds itself (LibTorch version, GPU count, the CPU-Adam path); DeepSpeed's two
// --hide_* flags work; and show_config() text from a CUDA build parses into its versions.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include "deepspeed/version.h"
#include "ops/cpu_adam/cpu_adam.h"
#include "support/run_command.h"
#include "torch_build_info.h"

namespace deepspeed {
namespace {

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The value printed after "name ..... " on its row; "" when the row is missing.
std::string row_value(const std::string& text, const std::string& name) {
  std::size_t at = text.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  std::size_t start = text.find_first_not_of(". ", at + 1 + name.size());
  return text.substr(start, text.find('\n', start) - start);
}

TEST(DsReport, PrintsEveryRowWithThisMachinesValues) {
  auto r = testing::run_command(std::string(DS_REPORT_BIN));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::string& out = r.out;
  EXPECT_TRUE(contains(out, "DeepSpeed C++/CUDA extension op report")) << out;
  EXPECT_TRUE(contains(out, "cpu_adam ............... [YES] ...... [OKAY]")) << out;
  EXPECT_TRUE(contains(out, "DeepSpeed general environment info:"));
  EXPECT_EQ(row_value(out, "deepspeed-cpp version").rfind(kVersion, 0), 0u) << out;
  EXPECT_TRUE(contains(row_value(out, "deepspeed-cpp compiled w."), std::string("torch ") + TORCH_VERSION)) << out;
  EXPECT_EQ(row_value(out, "torch version"), TORCH_VERSION) << out;
  for (const char* name : {"deepspeed-cpp install path", "torch install path", "torch cuda version",
                           "torch cudnn version", "torch BLAS", "torch CPU capability", "CPU", "OpenMP threads",
                           "shared memory (/dev/shm) size"}) {
    EXPECT_FALSE(row_value(out, name).empty()) << "no row '" << name << "' in\n" << out;
  }
  EXPECT_TRUE(contains(row_value(out, "torch distributed backends"), "gloo [YES], nccl ")) << out;
  const int gpus = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  EXPECT_EQ(row_value(out, "GPUs visible").rfind(std::to_string(gpus) + " (CUDA available: ", 0), 0u) << out;
  const std::string path = ops::simd_level_name(ops::default_simd_level());
  EXPECT_EQ(row_value(out, "CPU-Adam path").rfind(path + " (best here: " +
                                                  ops::simd_level_name(ops::detect_simd_level()), 0),
            0u)
      << out;
  __builtin_cpu_init();
  EXPECT_EQ(contains(row_value(out, "CPU vector extensions"), "avx2"), __builtin_cpu_supports("avx2") != 0) << out;
}

TEST(DsReport, CpuAdamOverride_IsShownAndWarned_AndHideFlagsWork) {
  auto r = testing::run_command(std::string("DS_CPU_ADAM_SIMD=scalar ") + DS_REPORT_BIN);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(row_value(r.out, "CPU-Adam path").rfind("scalar (best here:", 0), 0u) << r.out;
  if (ops::detect_simd_level() != ops::SimdLevel::kScalar) {
    EXPECT_TRUE(contains(r.out, "[WARNING] DS_CPU_ADAM_SIMD lowers cpu_adam to the scalar path")) << r.out;
  }
  auto hidden = testing::run_command(std::string("DS_CPU_ADAM_SIMD=scalar ") + DS_REPORT_BIN +
                                     " --hide_operator_status --hide_errors_and_warnings");
  ASSERT_EQ(hidden.exit_code, 0);
  EXPECT_FALSE(contains(hidden.out, "op report")) << hidden.out;
  EXPECT_FALSE(contains(hidden.out, "[WARNING]")) << hidden.out;
  EXPECT_TRUE(contains(hidden.out, "DeepSpeed general environment info:"));
  EXPECT_NE(testing::run_command(std::string(DS_REPORT_BIN) + " --bogus").exit_code, 0);
}

TEST(TorchBuildInfo, ParsesACudaBuildsShowConfig) {
  const std::string text =
      "PyTorch built with:\n"
      "  - GCC 9.3\n"
      "  - CPU capability usage: AVX512\n"
      "  - CUDA Runtime 12.1\n"
      "  - NVCC architecture flags: -gencode;arch=compute_80,code=sm_80\n"
      "  - CuDNN 8.9.2\n"
      "  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, CUDA_VERSION=12.1, CXX_FLAGS= -O2 -fPIC -Wall, "
      "TORCH_VERSION=2.1.0, USE_CUDA=ON, USE_CUDNN=ON, USE_MPI=OFF, USE_NCCL=1, \n";
  report::TorchBuildInfo info = report::parse_show_config(text);
  EXPECT_EQ(info.cuda_runtime, "12.1");
  EXPECT_EQ(info.cudnn, "8.9.2");
  EXPECT_EQ(info.cpu_capability, "AVX512");
  EXPECT_EQ(info.setting("TORCH_VERSION"), "2.1.0");
  EXPECT_EQ(info.setting("USE_NCCL"), "1");
  EXPECT_EQ(info.setting("USE_MPI"), "OFF");
  EXPECT_EQ(info.setting("CXX_FLAGS"), "-O2 -fPIC -Wall");
  EXPECT_EQ(info.setting("USE_GLOO", "absent"), "absent");
}

}  // namespace
}  // namespace deepspeed

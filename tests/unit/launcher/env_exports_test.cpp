// Tests for what a multi-node launch exports to every host (tools/deepspeed/env_exports.cpp):
// DeepSpeed's prefixes plus ours, PYTHONPATH, and .deepspeed_env files (format and precedence).
#include "env_exports.h"

#include <gtest/gtest.h>

#include <map>

#include "expect_usage.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;

std::map<std::string, std::string> as_map(const std::vector<EnvVar>& vars) { return {vars.begin(), vars.end()}; }

TEST(EnvExports, PicksExportedPrefixesOnly) {
  HostInfo host;
  host.cwd = "/work/job";
  host.environment = {{"NCCL_DEBUG", "INFO"},     {"GLOO_SOCKET_IFNAME", "eth1"}, {"OMP_NUM_THREADS", "4"},
                      {"PYTHONPATH", "/opt/lib"}, {"UCX_TLS", "rc"},              {"MLFLOW_RUN", "7"},
                      {"DEEPSPEED_TIMEOUT", "5"}, {"DS_CPU_ADAM_SIMD", "avx2"},   {"HOME", "/root"},
                      {"OPENBLAS_CORETYPE", "Haswell"}, {"MKL_NUM_THREADS", "1"},
                      {"ONEDNN_MAX_CPU_ISA", "AVX2"},
                      {"CUDA_VISIBLE_DEVICES", "0"}, {"LD_LIBRARY_PATH", "/x"},    {"MY_NCCL", "no"}};
  auto exports = as_map(collect_exports(host));
  EXPECT_EQ(exports["NCCL_DEBUG"], "INFO");
  EXPECT_EQ(exports["GLOO_SOCKET_IFNAME"], "eth1");
  EXPECT_EQ(exports["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(exports["PYTHONPATH"], "/work/job:/opt/lib") << "DeepSpeed puts the launch directory first";
  EXPECT_EQ(exports["UCX_TLS"], "rc");
  EXPECT_EQ(exports["MLFLOW_RUN"], "7");
  EXPECT_EQ(exports["DEEPSPEED_TIMEOUT"], "5");
  EXPECT_EQ(exports["DS_CPU_ADAM_SIMD"], "avx2");
  // The BLAS kernels change results: remote ranks must compute as the launching host does.
  EXPECT_EQ(exports["OPENBLAS_CORETYPE"], "Haswell");
  EXPECT_EQ(exports["MKL_NUM_THREADS"], "1");
  EXPECT_EQ(exports["ONEDNN_MAX_CPU_ISA"], "AVX2");
  for (const char* kept_home : {"HOME", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "MY_NCCL"}) {
    EXPECT_EQ(exports.count(kept_home), 0u) << kept_home;
  }
}

TEST(EnvExports, PythonPathIsTheLaunchDirectoryWhenUnset) {
  HostInfo host;
  host.cwd = "/work/job";
  EXPECT_EQ(as_map(collect_exports(host))["PYTHONPATH"], "/work/job");
}

TEST(EnvExports, DeepSpeedEnvFiles_HomeThenCurrentDirectory_LaterWins) {
  HostInfo host;
  host.cwd = "/work/job";
  host.environment = {{"NCCL_DEBUG", "WARN"}};
  host.deepspeed_env_files = {{"/root/.deepspeed_env", "NCCL_DEBUG=INFO\nFROM_HOME=1\nSHARED=home\n"},
                              {"/work/job/.deepspeed_env", "SHARED = cwd \n\n# comment\nURL=a=b\n"}};
  auto exports = as_map(collect_exports(host));
  EXPECT_EQ(exports["NCCL_DEBUG"], "INFO") << "the file overrides the environment";
  EXPECT_EQ(exports["FROM_HOME"], "1");
  EXPECT_EQ(exports["SHARED"], "cwd") << "trimmed; the current directory's file is read last";
  EXPECT_EQ(exports["URL"], "a=b") << "split at the first '='";
}

TEST(EnvExports, MalformedDeepSpeedEnv_NamesFileAndLine) {
  expect_usage_error([] { parse_deepspeed_env("A=1\nJUSTANAME\n", "/root/.deepspeed_env"); },
                     {"/root/.deepspeed_env line 2 'JUSTANAME'", "expected NAME=VALUE"});
  expect_usage_error([] { parse_deepspeed_env("export A=1\n", "f"); }, {"f line 1", "'export A' is not a variable name"});
  expect_usage_error([] { parse_deepspeed_env("1A=1\n", "f"); }, {"'1A' is not a variable name"});
  expect_usage_error([] { parse_deepspeed_env("=1\n", "f"); }, {"'' is not a variable name"});
}

}  // namespace
}  // namespace deepspeed::launcher

// Tests for the multi-node command lines (tools/deepspeed/multinode_commands.cpp): the per-node
// launcher and the shell command ssh runs (executed here through /bin/sh), and the mpirun and srun
// commands DeepSpeed's runners build, word for word.
#include "multinode_commands.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "expect_usage.h"
#include "shell_words.h"
#include "test_process.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;
using Words = std::vector<std::string>;

MultiNodeJob job_for(const std::string& launcher) {
  MultiNodeJob job;
  job.options.launcher = launcher;
  job.options.hostfile = "/job/hostfile";
  job.options.master_port = 29600;
  job.options.program = "./train_gpt";
  job.options.program_args = {"--deepspeed_config", "ds config.json"};
  job.world = {{"worker-0", {0, 1}}, {"worker-1", {0, 1}}};
  job.pool = {{"worker-0", 2, 1}, {"worker-1", 2, 2}};
  job.master_addr = "10.0.0.1";
  job.exports = {{"NCCL_DEBUG", "INFO"}, {"PYTHONPATH", "/work/my job"}};
  job.launcher_path = "/opt/ds/bin/deepspeed";
  job.cwd = "/work/my job";
  return job;
}

bool contains(const Words& words, const Words& run) {
  return std::search(words.begin(), words.end(), run.begin(), run.end()) != words.end();
}

TEST(NodeLauncherArgv, CarriesWorldNodeAndPerNodeFlags) {
  MultiNodeJob job = job_for("pdsh");
  job.options.no_local_rank = true;
  job.options.save_pid = true;
  job.options.bind_cores_to_rank = true;
  job.options.bind_core_list = "0-3";
  job.options.enable_each_rank_log = "/logs";
  Words argv = node_launcher_argv(job, 1);
  EXPECT_EQ(argv, (Words{"/opt/ds/bin/deepspeed", "--world_info=" + encode_world_info(job.world), "--node_rank=1",
                         "--master_addr=10.0.0.1", "--master_port=29600", "--stop_on_stdin_eof", "--log_level=info",
                         "--no_local_rank", "--save_pid", "--enable_each_rank_log=/logs", "--bind_cores_to_rank",
                         "--bind_core_list=0-3", "--", "./train_gpt", "--deepspeed_config", "ds config.json"}));
}

TEST(RemoteShellCommand, RunsInAShellWithExportsInTheLaunchDirectory) {
  launcher::testing::TempDir dir;
  const std::string fake = dir.path() + "/fake launcher";
  std::ofstream(fake) << "#!/bin/sh\nprintf 'arg=%s\\n' \"$@\"\necho \"NCCL_DEBUG=$NCCL_DEBUG\"\n"
                         "echo \"PYTHONPATH=$PYTHONPATH\"\necho \"VENV=$VENV\"\necho \"pwd=$(pwd)\"\n";
  ASSERT_EQ(::chmod(fake.c_str(), 0755), 0);
  const std::string venv = dir.path() + "/venv.sh";
  std::ofstream(venv) << "VENV=sourced\nexport VENV\n";
  MultiNodeJob job = job_for("pdsh");
  job.launcher_path = fake;
  job.cwd = dir.path();
  job.options.venv_script = venv;
  job.exports = {{"NCCL_DEBUG", "it's $HOME"}, {"PYTHONPATH", dir.path()}};
  std::string command = remote_shell_command(job, 0);
  EXPECT_EQ(command.rfind(". ", 0), 0u) << command;

  std::string out;
  FILE* pipe = ::popen(("cd / && /bin/sh -c " + shell_quote(command)).c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  EXPECT_EQ(::pclose(pipe), 0) << out;
  EXPECT_NE(out.find("arg=--node_rank=0\n"), std::string::npos) << out;
  EXPECT_NE(out.find("arg=--\narg=./train_gpt\narg=--deepspeed_config\narg=ds config.json\n"), std::string::npos) << out;
  EXPECT_NE(out.find("NCCL_DEBUG=it's $HOME\n"), std::string::npos) << out;
  EXPECT_NE(out.find("PYTHONPATH=" + dir.path() + "\n"), std::string::npos) << out;
  EXPECT_NE(out.find("VENV=sourced\n"), std::string::npos) << out;
  EXPECT_NE(out.find("pwd=" + dir.path() + "\n"), std::string::npos) << out;
}

TEST(SshArgv, UserArgsFirstThenBatchModeAndPort) {
  MultiNodeJob job = job_for("pdsh");
  job.options.launcher_args = "-F '/tmp/my ssh/config' -o ServerAliveInterval=2";
  job.options.ssh_port = 2222;
  Words argv = ssh_argv(job, 1);
  ASSERT_GE(argv.size(), 8u);
  EXPECT_EQ(Words(argv.begin(), argv.begin() + 5),
            (Words{"ssh", "-F", "/tmp/my ssh/config", "-o", "ServerAliveInterval=2"}));
  EXPECT_TRUE(contains(argv, {"-o", "BatchMode=yes"}));
  EXPECT_TRUE(contains(argv, {"-p", "2222", "worker-1"}));
  EXPECT_EQ(argv.back(), remote_shell_command(job, 1));
}

TEST(SshProbeArgv, UsesLauncherArgsOnlyForPdsh) {
  LauncherOptions o;
  o.launcher_args = "-F cfg";
  EXPECT_EQ(ssh_probe_argv(o, "h", {"hostname", "-I"}),
            (Words{"ssh", "-F", "cfg", "-T", "-x", "-a", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "h",
                   "hostname -I"}));
  o.launcher = "openmpi";
  o.ssh_port = 22;
  EXPECT_EQ(ssh_probe_argv(o, "h", {"hostname"}),
            (Words{"ssh", "-T", "-x", "-a", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-p", "22", "h",
                   "hostname"}));
}

TEST(MpirunArgv, IsDeepSpeedsCommandPlusTheRendezvous) {
  MultiNodeJob job = job_for("openmpi");
  EXPECT_EQ(mpirun_argv(job),
            (Words{"mpirun", "-n", "4", "-hostfile", "/job/hostfile", "--mca", "btl", "^openib", "--mca",
                   "btl_tcp_if_include", "eth0", "-x", "UCX_TLS=tcp", "-x", "NCCL_DEBUG=INFO", "-x",
                   "PYTHONPATH=/work/my job", "-x", "MASTER_ADDR=10.0.0.1", "-x", "MASTER_PORT=29600", "./train_gpt",
                   "--deepspeed_config", "ds config.json"}));
}

TEST(MpirunArgv, UserInterfaceChoiceReplacesEth0) {
  MultiNodeJob job = job_for("openmpi");
  job.options.launcher_args = "--allow-run-as-root -mca btl_tcp_if_include veth0";
  Words argv = mpirun_argv(job);
  EXPECT_FALSE(contains(argv, {"eth0"}));
  EXPECT_TRUE(contains(argv, {"^openib", "--allow-run-as-root", "-mca", "btl_tcp_if_include", "veth0", "-x"}));
}

TEST(MpichArgv, IsDeepSpeedsCommandWithGenvPairs) {
  MultiNodeJob job = job_for("mpich");
  job.options.launcher_args = "-bind-to core";
  EXPECT_EQ(mpich_argv(job),
            (Words{"mpirun", "-n", "4", "-ppn", "2", "-bind-to", "core", "-genv", "NCCL_DEBUG", "INFO", "-genv",
                   "PYTHONPATH", "/work/my job", "-genv", "MASTER_ADDR", "10.0.0.1", "-genv", "MASTER_PORT", "29600",
                   "-genv", "WORLD_SIZE", "4", "-genv", "LOCAL_SIZE", "2", "-hosts", "worker-0,worker-1",
                   "./train_gpt", "--deepspeed_config", "ds config.json"}));
}

TEST(ImpiArgv, GivesEachRankItsSectionWithRankAndLocalRank) {
  MultiNodeJob job = job_for("impi");
  const Words argv = impi_argv(job);
  EXPECT_EQ(Words(argv.begin(), argv.begin() + 3), (Words{"mpirun", "-ppn", "2"}));
  EXPECT_TRUE(contains(argv, {"-genv", "WORLD_SIZE", "4", "-genv", "LOCAL_SIZE", "2", "-genv", "I_MPI_PIN", "0",
                              "-hosts", "worker-0,worker-1", "-n", "1", "-env", "RANK", "0", "-env", "LOCAL_RANK",
                              "0", "./train_gpt", "--deepspeed_config", "ds config.json", ":", "-n", "1", "-env",
                              "RANK", "1", "-env", "LOCAL_RANK", "1", "./train_gpt"}));
  EXPECT_TRUE(contains(argv, {":", "-n", "1", "-env", "RANK", "3", "-env", "LOCAL_RANK", "1", "./train_gpt",
                              "--deepspeed_config", "ds config.json"}));
  EXPECT_EQ(argv.back(), "ds config.json");
  EXPECT_EQ(std::count(argv.begin(), argv.end(), ":"), 3);
}

TEST(MvapichArgv, IsDeepSpeedsCommandWithItsTuningAndAHostsFile) {
  MultiNodeJob job = job_for("mvapich");
  EXPECT_EQ(mvapich_hosts_file_text(job), "worker-0\nworker-1\n");
  EXPECT_EQ(mvapich_argv(job, "/tmp/hosts"),
            (Words{"mpirun", "-np", "4", "-ppn", "2", "--hostfile", "/tmp/hosts", "-env", "MV2_SMP_USE_CMA=0", "-env",
                   "MV2_DEBUG_SHOW_BACKTRACE=1", "-env", "MV2_SUPPORT_DL=1", "-env", "MV2_ENABLE_AFFINITY=0", "-env",
                   "MV2_INTER_ALLGATHER_TUNING=5", "-env", "MV2_CUDA_USE_NAIVE=0", "-env", "NCCL_DEBUG=INFO", "-env",
                   "PYTHONPATH=/work/my job", "-env", "MASTER_ADDR=10.0.0.1", "-env", "MASTER_PORT=29600",
                   "./train_gpt", "--deepspeed_config", "ds config.json"}));
}

TEST(MpiArgv, UnequalSlotsPerHostAreRefusedByName) {
  for (const std::string launcher : {"mpich", "impi", "mvapich"}) {
    MultiNodeJob job = job_for(launcher);
    job.pool = {{"worker-0", 2, 1}, {"worker-1", 3, 2}};
    auto build = [&] {
      if (launcher == "mpich") mpich_argv(job);
      if (launcher == "impi") impi_argv(job);
      if (launcher == "mvapich") mvapich_argv(job, "/tmp/hosts");
    };
    expect_usage_error(build, {"requires same number of devices per node", "worker-0 2 slots and worker-1 3"});
  }
}

TEST(SrunArgv, IsDeepSpeedsCommandWithNodelist) {
  MultiNodeJob job = job_for("slurm");
  EXPECT_EQ(srun_argv(job), (Words{"srun", "-n", "4",
                                   "--export=ALL,NCCL_DEBUG=INFO,PYTHONPATH=/work/my job,MASTER_ADDR=10.0.0.1,"
                                   "MASTER_PORT=29600",
                                   "./train_gpt", "--deepspeed_config", "ds config.json"}));
  job.options.launcher_args = "--partition gpu";
  job.options.include = "worker-1@worker-0";
  job.world = {{"worker-0", {0, 1}}, {"worker-1", {0, 1}}};
  Words with_include = srun_argv(job);
  EXPECT_TRUE(contains(with_include, {"srun", "-n", "4", "--partition", "gpu", "--nodelist=worker-1,worker-0"}));
  job.options.include.clear();
  job.options.exclude = "worker-2";
  job.options.num_nodes = 2;
  job.options.num_gpus = 2;
  EXPECT_TRUE(contains(srun_argv(job), {"--exclude=worker-2", "--nodes=2", "--ntasks-per-node=2"}));
}

TEST(SrunArgv, RefusesSlotsAndCommasByName) {
  MultiNodeJob job = job_for("slurm");
  job.options.include = "worker-0:0";
  expect_usage_error([&] { srun_argv(job); }, {"--include 'worker-0:0'", "cannot place ranks on particular slots"});
  job.options.include.clear();
  job.exports = {{"NCCL_IB_HCA", "mlx5_0,mlx5_1"}};
  expect_usage_error([&] { srun_argv(job); }, {"NCCL_IB_HCA='mlx5_0,mlx5_1'", "contains ','"});
}

TEST(ValidateMultiNode, RefusesWhatABackendCannotHonour) {
  LauncherOptions o;
  o.launcher = "openmpi";
  o.include = "a";
  expect_usage_error([&] { validate_multinode_options(o); }, {"openmpi does not support worker include/exclusion"});
  o.include.clear();
  o.num_gpus = 2;
  expect_usage_error([&] { validate_multinode_options(o); }, {"openmpi does not support limiting num nodes/gpus"});
  o.num_gpus = -1;
  o.bind_cores_to_rank = true;
  expect_usage_error([&] { validate_multinode_options(o); }, {"--bind_cores_to_rank is not supported with --launcher openmpi"});
  o.launcher = "slurm";
  o.bind_cores_to_rank = false;
  o.enable_each_rank_log = "/logs";
  expect_usage_error([&] { validate_multinode_options(o); }, {"--enable_each_rank_log is not supported with --launcher slurm"});
  o.launcher = "mpich";
  expect_usage_error([&] { validate_multinode_options(o); }, {"--enable_each_rank_log is not supported with --launcher mpich"});
  o.enable_each_rank_log.clear();
  o.launcher = "impi";
  o.exclude = "a";
  expect_usage_error([&] { validate_multinode_options(o); }, {"impi does not support worker include/exclusion"});
  o.exclude.clear();
  o.launcher = "jsrun";
  expect_usage_error([&] { validate_multinode_options(o); }, {"--launcher jsrun is not supported"});
  o.launcher = "pdsh";
  o.include = "a";
  o.bind_cores_to_rank = true;
  validate_multinode_options(o);  // the ssh path applies all of them
}

}  // namespace
}  // namespace deepspeed::launcher

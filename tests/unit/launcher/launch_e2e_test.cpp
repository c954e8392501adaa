// End-to-end tests of the launcher's paths other than the plain local run (tools/deepspeed/launch.cpp):
// a one-host hostfile run here, per-node mode and its stdin lifeline, and the openmpi and slurm
// backends through stand-in `mpirun`/`srun` scripts that record how they were called. The real
// multi-host runs (ssh, mpirun across network namespaces) are in tests/e2e/multihost/.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "test_process.h"
#include "world_info.h"

namespace deepspeed::launcher {
namespace {

using testing::ProcessResult;
using testing::TempDir;
using testing::TestProcess;
using Env = std::vector<std::pair<std::string, std::string>>;

const Env kTestEnv = {{"DS_LAUNCHER_KILL_GRACE_S", "2"}};

std::string launcher() { return testing::required_env("DS_TEST_LAUNCHER"); }
std::string probe() { return testing::required_env("DS_TEST_PROBE"); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string write_file(const std::string& path, const std::string& text, bool executable = false) {
  std::ofstream(path) << text;
  if (executable) ::chmod(path.c_str(), 0755);
  return path;
}

pid_t read_pid(const std::string& dir, int rank) {
  std::string text = testing::read_file(dir + "/rank" + std::to_string(rank) + ".pid");
  return text.empty() ? -1 : static_cast<pid_t>(std::stoi(text));
}

TEST(LaunchE2E, OneHostHostfile_RunsTheIncludedSlotsHere) {
  TempDir dir;
  const std::string hosts = write_file(dir.path() + "/hosts", "# one box\nlocalhost slots=3\n");
  ProcessResult r = testing::run_process(
      {launcher(), "--hostfile", hosts, "--include", "localhost:0,2", "--master_port", "29612", probe()}, kTestEnv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.err, "hostfile " + hosts + ": using localhost:0,2")) << r.err;
  for (int rank : {0, 1}) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "env RANK=" + std::to_string(rank) + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "env WORLD_SIZE=2\n"));
    EXPECT_TRUE(contains(r.out, p + "env MASTER_ADDR=127.0.0.1\n"));
  }
  EXPECT_FALSE(contains(r.out, "[rank 2]"));
}

TEST(LaunchE2E, MalformedHostfileOrSelection_Exits2NamingIt) {
  TempDir dir;
  const std::string hosts = write_file(dir.path() + "/hosts", "a slots=2\nb slots=two\n");
  ProcessResult bad = testing::run_process({launcher(), "-H", hosts, probe()}, kTestEnv);
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(contains(bad.err, hosts + " line 2 'b slots=two': slots must be a positive integer")) << bad.err;
  EXPECT_TRUE(bad.out.empty());

  write_file(hosts, "a slots=2\nb slots=2\n");
  ProcessResult unknown = testing::run_process({launcher(), "-H", hosts, "-i", "a@c:1", probe()}, kTestEnv);
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_TRUE(contains(unknown.err, "--include 'a@c:1': host 'c' is not in the hostfile")) << unknown.err;
  ProcessResult everything = testing::run_process({launcher(), "-H", hosts, "-e", "a@b", probe()}, kTestEnv);
  EXPECT_EQ(everything.exit_code, 2);
  EXPECT_TRUE(contains(everything.err, "excludes every slot")) << everything.err;
  ProcessResult no_gpus = testing::run_process({launcher(), "-i", "localhost:0", probe()}, kTestEnv);
  EXPECT_EQ(no_gpus.exit_code, 2);
  EXPECT_TRUE(contains(no_gpus.err, "--include without a hostfile")) << no_gpus.err;
}

std::string two_host_world() { return encode_world_info({{"host-a", {0, 1}}, {"host-b", {0, 1, 2}}}); }

TEST(LaunchE2E, PerNodeMode_StartsThisHostsRanks) {
  ProcessResult r = testing::run_process({launcher(), "-q", "--world_info=" + two_host_world(), "--node_rank=1",
                                          "--master_addr=10.9.9.9", "--master_port=29613", probe(), "x"},
                                         kTestEnv);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int local = 0; local < 3; ++local) {
    const int rank = 2 + local;
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "env LOCAL_RANK=" + std::to_string(local) + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "env WORLD_SIZE=5\n"));
    EXPECT_TRUE(contains(r.out, p + "env LOCAL_WORLD_SIZE=3\n"));
    EXPECT_TRUE(contains(r.out, p + "env CROSS_RANK=1\n"));
    EXPECT_TRUE(contains(r.out, p + "env CROSS_SIZE=2\n"));
    EXPECT_TRUE(contains(r.out, p + "env MASTER_ADDR=10.9.9.9\n"));
    EXPECT_TRUE(contains(r.out, p + "arg 1=--local_rank=" + std::to_string(local) + "\n"));
  }
  ProcessResult missing = testing::run_process({launcher(), "--world_info=" + two_host_world(), probe()}, kTestEnv);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_TRUE(contains(missing.err, "--world_info needs --node_rank")) << missing.err;
}

// See Note [Stdin lifeline] in tools/deepspeed/process_runner.h.
TEST(LaunchE2E, PerNodeMode_StdinEof_StopsEveryRank) {
  TempDir pids;
  TestProcess p({launcher(), "--world_info=" + two_host_world(), "--node_rank=0", "--master_addr=10.9.9.9",
                 "--stop_on_stdin_eof", probe(), "--pid_dir=*:" + pids.path(), "--sleep_s=*:60"},
                kTestEnv, {}, {}, /*pipe_stdin=*/true);
  ASSERT_TRUE(p.wait_for_stdout("] ready", 2, 10)) << p.stderr_text();
  const double closed = testing::monotonic_seconds();
  p.close_stdin();
  ProcessResult r = p.wait(30);
  EXPECT_LT(testing::monotonic_seconds() - closed, 5.0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "lost the launcher that started this host (stdin closed); forwarding SIGTERM")) << r.err;
  for (int rank : {0, 1}) EXPECT_FALSE(testing::process_alive(read_pid(pids.path(), rank))) << rank;
}

TEST(LaunchE2E, PerNodeMode_StdinSigint_ForwardsSigint) {
  TestProcess p({launcher(), "--world_info=" + two_host_world(), "--node_rank=0", "--master_addr=10.9.9.9",
                 "--stop_on_stdin_eof", probe(), "--sleep_s=*:60"},
                kTestEnv, {}, {}, /*pipe_stdin=*/true);
  ASSERT_TRUE(p.wait_for_stdout("] ready", 2, 10)) << p.stderr_text();
  ASSERT_TRUE(p.write_stdin("SIGINT\n"));
  ProcessResult r = p.wait(30);
  EXPECT_LT(r.elapsed_s, 10.0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "asked to stop; forwarding SIGINT to 2 rank(s)")) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 0 \(pid \d+\) was killed by signal 2)"))) << r.err;
}

TEST(LaunchE2E, PerNodeMode_ReportsTheFailedRankForTheController) {
  TestProcess p({launcher(), "--world_info=" + two_host_world(), "--node_rank=1", "--master_addr=10.9.9.9",
                 "--stop_on_stdin_eof", probe(), "--exit_code=3:7", "--sleep_s=*:30", "--sleep_s=3:0.2"},
                kTestEnv, {}, {}, /*pipe_stdin=*/true);
  ProcessResult r = p.wait(20);
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"((^|\n)deepspeed-node: rank 3 \(pid \d+\) exited with status 7\n)")))
      << r.err;
}

// A stand-in for mpirun/srun: prints its arguments one per line, the variables the job needs, and
// exits with $FAKE_EXIT.
std::string fake_backend(const std::string& dir, const std::string& name) {
  return write_file(dir + "/" + name,
                    "#!/bin/sh\nfor a in \"$@\"; do printf 'argv %s\\n' \"$a\"; done\n"
                    "exit ${FAKE_EXIT:-0}\n",
                    true);
}

struct FakeRun {
  ProcessResult result;
  std::vector<std::string> argv;  // the backend's arguments
};

FakeRun run_with_fake(const std::string& backend, const std::vector<std::string>& flags, Env extra = {}) {
  TempDir bin;
  fake_backend(bin.path(), backend);
  TempDir job;
  write_file(job.path() + "/hosts", "node-a slots=2\nnode-b slots=2\n");
  write_file(job.path() + "/.deepspeed_env", "FROM_ENV_FILE=yes\n");
  Env env = kTestEnv;
  env.emplace_back("PATH", bin.path() + ":" + std::getenv("PATH"));
  env.emplace_back("NCCL_SOCKET_IFNAME", "eth9");
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<std::string> argv = {launcher(), "--hostfile", "hosts", "--launcher", backend == "srun" ? "slurm" : "openmpi",
                                   "--master_addr", "10.1.1.1", "--no_ssh_check"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back(probe());
  argv.push_back("--flag");
  FakeRun run{testing::run_process(argv, env, 20, job.path()), {}};
  for (const std::string& line : testing::split_lines(run.result.out)) {
    if (line.rfind("argv ", 0) == 0) run.argv.push_back(line.substr(5));
  }
  return run;
}

TEST(LaunchE2E, Slurm_BuildsTheSrunCommand) {
  FakeRun run = run_with_fake("srun", {"--launcher_args", "--partition=debug"});
  ASSERT_EQ(run.result.exit_code, 0) << run.result.err;
  ASSERT_GE(run.argv.size(), 6u) << run.result.out;
  EXPECT_EQ(std::vector<std::string>(run.argv.begin(), run.argv.begin() + 3),
            (std::vector<std::string>{"-n", "4", "--partition=debug"}));
  const std::string& exports = run.argv[3];
  EXPECT_EQ(exports.rfind("--export=ALL,", 0), 0u) << exports;
  for (const char* part : {",NCCL_SOCKET_IFNAME=eth9", ",FROM_ENV_FILE=yes", ",MASTER_ADDR=10.1.1.1", ",MASTER_PORT=29500"}) {
    EXPECT_TRUE(contains(exports, part)) << exports << " lacks " << part;
  }
  EXPECT_EQ(run.argv[4], probe());
  EXPECT_EQ(run.argv[5], "--flag") << "no --local_rank: ranks read SLURM_LOCALID";
  EXPECT_TRUE(contains(run.result.err, "cmd = srun -n 4")) << run.result.err;
}

TEST(LaunchE2E, OpenMpi_BuildsTheMpirunCommand_AndReturnsItsStatus) {
  FakeRun run = run_with_fake("mpirun", {}, {{"FAKE_EXIT", "5"}});
  EXPECT_EQ(run.result.exit_code, 5) << run.result.err;
  ASSERT_GE(run.argv.size(), 10u) << run.result.out;
  EXPECT_EQ(std::vector<std::string>(run.argv.begin(), run.argv.begin() + 10),
            (std::vector<std::string>{"-n", "4", "-hostfile", "hosts", "--mca", "btl", "^openib", "--mca",
                                      "btl_tcp_if_include", "eth0"}));
  auto has = [&](const std::string& word) { return std::find(run.argv.begin(), run.argv.end(), word) != run.argv.end(); };
  EXPECT_TRUE(has("UCX_TLS=tcp"));
  EXPECT_TRUE(has("NCCL_SOCKET_IFNAME=eth9"));
  EXPECT_TRUE(has("FROM_ENV_FILE=yes"));
  EXPECT_TRUE(has("MASTER_ADDR=10.1.1.1"));
  EXPECT_EQ(run.argv.back(), "--flag");
  EXPECT_TRUE(contains(run.result.err, "mpirun (pid ")) << run.result.err;
  EXPECT_TRUE(contains(run.result.err, "exited with status 5")) << run.result.err;
}

TEST(LaunchE2E, MissingBackend_SaysNotInstalled) {
  TempDir job;
  write_file(job.path() + "/hosts", "node-a slots=1\nnode-b slots=1\n");
  ProcessResult r = testing::run_process({launcher(), "-H", "hosts", "--launcher", "slurm", "--no_ssh_check", probe()},
                                         {{"PATH", "/nonexistent"}}, 20, job.path());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "launcher 'slurm' not installed")) << r.err;
}

TEST(LaunchE2E, UnreachableFirstHost_FailsTheSshCheck) {
  TempDir job;
  write_file(job.path() + "/hosts", "127.0.0.1 slots=1\n127.0.0.2 slots=1\n");
  // Port 1 refuses at once, so the check fails fast without any sshd on this machine.
  ProcessResult r = testing::run_process({launcher(), "-H", "hosts", "--ssh_port", "1", "--launcher_args",
                                          "-o ConnectTimeout=3 -o StrictHostKeyChecking=no", probe()},
                                         kTestEnv, 30, job.path());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(r.err, "host=127.0.0.1 was not reachable via ssh")) << r.err;
}

}  // namespace
}  // namespace deepspeed::launcher

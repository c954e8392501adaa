// End-to-end tests of the `deepspeed` launcher binary with launcher_probe as the rank program:
// per-rank environment and arguments, "[rank R] " output relay, failure propagation, signals.
// Binary paths come from ctest (DS_TEST_LAUNCHER, DS_TEST_PROBE); see CMakeLists.txt here.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "test_process.h"

namespace deepspeed::launcher {
namespace {

using testing::ProcessResult;
using testing::TempDir;
using testing::TestProcess;

// Short grace so the stop paths finish fast; the tests that need the 30 s default don't exist.
const std::vector<std::pair<std::string, std::string>> kTestEnv = {{"DS_LAUNCHER_KILL_GRACE_S", "2"}};

std::string launcher() { return testing::required_env("DS_TEST_LAUNCHER"); }
std::string probe() { return testing::required_env("DS_TEST_PROBE"); }

std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

ProcessResult run_launcher(const std::vector<std::string>& args, double timeout_s = 20) {
  return testing::run_process(with({launcher()}, args), kTestEnv, timeout_s);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Rank `rank`'s lines of `text`, prefix removed, in order.
std::vector<std::string> lines_of(const std::string& text, int rank) {
  const std::string prefix = "[rank " + std::to_string(rank) + "] ";
  std::vector<std::string> lines;
  for (const std::string& line : testing::split_lines(text)) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

std::string pid_file(const std::string& dir, int rank) { return dir + "/rank" + std::to_string(rank) + ".pid"; }

pid_t read_pid(const std::string& dir, int rank) {
  std::string text = testing::read_file(pid_file(dir, rank));
  return text.empty() ? -1 : static_cast<pid_t>(std::stoi(text));
}

TEST(LauncherE2E, TwoRanks_GetDeepSpeedEnvAndPrefixedLines) {
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", "--master_port", "29611", probe(), "--foo",
                                  "bar", "--stderr=*:probe says hi"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const std::string& line : testing::split_lines(r.out)) {
    EXPECT_TRUE(line.rfind("[rank 0] ", 0) == 0 || line.rfind("[rank 1] ", 0) == 0) << line;
  }
  for (int rank : {0, 1}) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    const std::string rs = std::to_string(rank);
    EXPECT_TRUE(contains(r.out, p + "env RANK=" + rs + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "env LOCAL_RANK=" + rs + "\n"));
    EXPECT_TRUE(contains(r.out, p + "env WORLD_SIZE=2\n"));
    EXPECT_TRUE(contains(r.out, p + "env LOCAL_WORLD_SIZE=2\n"));
    EXPECT_TRUE(contains(r.out, p + "env LOCAL_SIZE=2\n"));
    EXPECT_TRUE(contains(r.out, p + "env CROSS_RANK=0\n"));
    EXPECT_TRUE(contains(r.out, p + "env CROSS_SIZE=1\n"));
    EXPECT_TRUE(contains(r.out, p + "env MASTER_ADDR=127.0.0.1\n"));
    EXPECT_TRUE(contains(r.out, p + "env MASTER_PORT=29611\n"));
    EXPECT_TRUE(contains(r.out, p + "arg 0=--foo\n" + p + "arg 1=bar\n"));
    EXPECT_TRUE(contains(r.out, p + "arg 3=--local_rank=" + rs + "\n"));
    EXPECT_FALSE(contains(r.out, p + "arg 4="));
    // stderr stays stderr, with the same prefix; -q leaves only rank lines there.
    EXPECT_TRUE(contains(r.err, p + "probe says hi\n")) << r.err;
  }
  EXPECT_FALSE(contains(r.out, "] probe says hi"));
  for (const std::string& line : testing::split_lines(r.err)) {
    EXPECT_TRUE(line.rfind("[rank ", 0) == 0) << "unexpected launcher message with -q: " << line;
  }
}

TEST(LauncherE2E, ArgsAfterProgram_ReachItUntouched) {
  ProcessResult r = run_launcher({"-q", "--num_gpus", "1", probe(), "--num_gpus", "7", "--foo", "--",
                                  "--master_port=1", "-h"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] arg 0=--num_gpus\n[rank 0] arg 1=7\n[rank 0] arg 2=--foo\n"
                              "[rank 0] arg 3=--\n[rank 0] arg 4=--master_port=1\n[rank 0] arg 5=-h\n"
                              "[rank 0] arg 6=--local_rank=0\n"))
      << r.out;
  EXPECT_TRUE(contains(r.out, "[rank 0] env WORLD_SIZE=1\n"));
}

TEST(LauncherE2E, NoLocalRank_AppendsNothing) {
  ProcessResult r = run_launcher({"-q", "--num_gpus", "1", "--no_local_rank", probe(), "x"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] arg 0=x\n"));
  EXPECT_FALSE(contains(r.out, "local_rank"));
}

TEST(LauncherE2E, FinalLineWithoutNewline_IsRelayedWhole) {
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", probe(), "--no_newline=1:the end"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> rank1 = lines_of(r.out, 1);
  ASSERT_GE(rank1.size(), 2u) << r.out;
  EXPECT_EQ(rank1[rank1.size() - 2], "ready");
  EXPECT_EQ(rank1.back(), "the end");
  ASSERT_FALSE(r.out.empty());
  EXPECT_EQ(r.out.back(), '\n');
}

TEST(LauncherE2E, ConcurrentOutput_NeverInterleavesHalfLines) {
  constexpr int kLines = 3000;
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", probe(), "--spam=*:" + std::to_string(kLines)});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::regex spam_line(R"(\[rank ([01])\] spam rank=([01]) i=(\d+) ([a-b]+))");
  int counts[2] = {0, 0};
  for (const std::string& line : testing::split_lines(r.out)) {
    if (line.find("] spam rank=") == std::string::npos) continue;
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, spam_line)) << "mangled line: " << line;
    ASSERT_EQ(m[1], m[2]) << line;
    int rank = std::stoi(m[1]);
    EXPECT_EQ(std::stoi(m[3]), counts[rank]) << "rank " << rank << " lines out of order";
    EXPECT_EQ(m[4].str(), std::string(200, static_cast<char>('a' + rank)));
    ++counts[rank];
  }
  EXPECT_EQ(counts[0], kLines);
  EXPECT_EQ(counts[1], kLines);
}

TEST(LauncherE2E, RankFailure_StopsOthersAndExitsWithItsStatus) {
  TempDir pids;
  ProcessResult r = run_launcher({"--num_gpus", "2", probe(), "--pid_dir=*:" + pids.path(), "--sleep_s=0:60",
                                  "--wait_for_file=1:" + pid_file(pids.path(), 0), "--exit_code=1:3"});
  EXPECT_FALSE(r.timed_out);
  EXPECT_LT(r.elapsed_s, 10.0) << "the launcher must not wait for rank 0's 60 s sleep";
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_TRUE(contains(r.err, "deepspeed: rank 1 (pid " + std::to_string(read_pid(pids.path(), 1)) +
                                  ") exited with status 3; stopping the other 1 rank(s)"))
      << r.err;
  ASSERT_GT(read_pid(pids.path(), 0), 0);
  EXPECT_FALSE(testing::process_alive(read_pid(pids.path(), 0)));
}

TEST(LauncherE2E, RankKilledBySignal_IsReportedWithTheSignal) {
  TempDir pids;
  ProcessResult r = run_launcher({"--num_gpus", "2", probe(), "--pid_dir=0:" + pids.path(), "--sleep_s=0:60",
                                  "--wait_for_file=1:" + pid_file(pids.path(), 0), "--kill_self=1:9"});
  EXPECT_LT(r.elapsed_s, 10.0);
  EXPECT_EQ(r.exit_code, 128 + 9) << r.err;
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(rank 1 \(pid \d+\) was killed by signal 9 \(Killed\); stopping the other 1 rank\(s\))")))
      << r.err;
}

TEST(LauncherE2E, SigtermToLauncher_StopsAllRanksAndExits1) {
  TempDir pids;
  TestProcess p(with({launcher(), "--num_gpus", "2", probe()}, {"--pid_dir=*:" + pids.path(), "--sleep_s=*:60"}),
                kTestEnv);
  ASSERT_TRUE(p.wait_for_stdout("] ready", 2, 10)) << p.stdout_text() << p.stderr_text();
  const double sent = testing::monotonic_seconds();
  ASSERT_EQ(::kill(p.pid(), SIGTERM), 0);
  ProcessResult r = p.wait(30);
  EXPECT_LT(testing::monotonic_seconds() - sent, 5.0);
  EXPECT_EQ(r.term_signal, 0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(contains(r.err, "received SIGTERM")) << r.err;
  for (int rank : {0, 1}) {
    ASSERT_GT(read_pid(pids.path(), rank), 0);
    EXPECT_FALSE(testing::process_alive(read_pid(pids.path(), rank))) << "rank " << rank;
  }
}

TEST(LauncherE2E, RankIgnoringSigterm_IsKilledAfterGrace) {
  TempDir pids;
  ProcessResult r = testing::run_process(
      {launcher(), "--num_gpus", "2", probe(), "--ignore_sigterm", "--pid_dir=*:" + pids.path(),
       "--sleep_s=0:60", "--wait_for_file=1:" + pid_file(pids.path(), 0), "--exit_code=1:3"},
      {{"DS_LAUNCHER_KILL_GRACE_S", "1"}});
  EXPECT_EQ(r.exit_code, 3) << r.err;
  EXPECT_GE(r.elapsed_s, 1.0);
  EXPECT_LT(r.elapsed_s, 10.0);
  EXPECT_TRUE(contains(r.err, "rank 0 still running 1 s after SIGTERM; sending SIGKILL")) << r.err;
  ASSERT_GT(read_pid(pids.path(), 0), 0);
  EXPECT_FALSE(testing::process_alive(read_pid(pids.path(), 0)));
}

TEST(LauncherE2E, MissingProgram_FailsBeforeStartingAnyRank) {
  ProcessResult r = run_launcher({"--num_gpus", "2", "/nonexistent/train_gpt", "--x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "/nonexistent/train_gpt")) << r.err;
  EXPECT_FALSE(contains(r.err, "[rank"));
  EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(LauncherE2E, ExecFailureInRank_ExitsWith127AndSaysWhy) {
  TempDir dir;
  const std::string bogus = dir.path() + "/not_a_binary";
  std::ofstream(bogus) << "this is not an executable format\n";
  ASSERT_EQ(::chmod(bogus.c_str(), 0755), 0);
  ProcessResult r = run_launcher({"--num_gpus", "1", bogus});
  EXPECT_EQ(r.exit_code, 127) << r.err;
  EXPECT_TRUE(contains(r.err, "[rank 0] deepspeed: cannot execute '" + bogus + "'")) << r.err;
  EXPECT_TRUE(contains(r.err, "rank 0 (pid ")) << r.err;
}

TEST(LauncherE2E, RejectedFlag_Exits2WithoutStartingRanks) {
  ProcessResult r = run_launcher({"--elastic_training", probe()});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_TRUE(contains(r.err, "--elastic_training: elastic training is not supported")) << r.err;
  EXPECT_TRUE(r.out.empty());
}

TEST(LauncherE2E, EachRankLog_WritesOneFilePerRank) {
  TempDir dir;
  const std::string logs = dir.path() + "/logs/nested";
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", "--enable_each_rank_log", logs, probe(),
                                  "--stderr=1:to stderr"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(logs)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  ASSERT_EQ(names.size(), 2u);
  EXPECT_TRUE(std::regex_match(names[0], std::regex(R"(\d{14}_rank0\.log)"))) << names[0];
  EXPECT_TRUE(std::regex_match(names[1], std::regex(R"(\d{14}_rank1\.log)"))) << names[1];
  std::string rank1 = testing::read_file(logs + "/" + names[1]);
  EXPECT_TRUE(contains(rank1, "env RANK=1\n")) << rank1;
  EXPECT_TRUE(contains(rank1, "to stderr\n"));
  EXPECT_FALSE(contains(rank1, "[rank")) << "per-rank logs hold the rank's own bytes";
  EXPECT_TRUE(contains(r.out, "[rank 1] env RANK=1\n")) << "the console still gets the output";
}

TEST(LauncherE2E, SavePid_WritesLauncherPidWhileRunning) {
  TestProcess p({launcher(), "-q", "--num_gpus", "1", "--save_pid", probe(), "--check_pid_file"}, kTestEnv);
  ProcessResult r = p.wait(20);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 0] pid_file " + std::to_string(p.pid()) + "\n")) << r.out;
  EXPECT_FALSE(std::filesystem::exists("/tmp/" + std::to_string(p.pid()) + ".deepspeed"));
}

TEST(LauncherE2E, BindCoresToRank_PinsEachRankToItsShare) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  std::vector<int> cores;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cores.push_back(cpu);
  }
  if (cores.size() < 2) GTEST_SKIP() << "needs 2 usable cores to give 2 ranks one each; found " << cores.size();
  const std::size_t per = cores.size() / 2;
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", "--bind_cores_to_rank", probe()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (int rank : {0, 1}) {
    std::string expected;
    for (std::size_t i = 0; i < per; ++i) {
      if (!expected.empty()) expected += ',';
      expected += std::to_string(cores[rank * per + i]);
    }
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_TRUE(contains(r.out, p + "affinity " + expected + "\n")) << r.out;
    EXPECT_TRUE(contains(r.out, p + "env OMP_NUM_THREADS=" + std::to_string(per) + "\n"));
  }
}

TEST(LauncherE2E, PythonProgram_GetsEnvAndLocalRankAfterItsArgs) {
  const std::string python = "/usr/bin/python3";
  if (::access(python.c_str(), X_OK) != 0) GTEST_SKIP() << python << " not installed";
  ProcessResult r = run_launcher({"-q", "--num_gpus", "2", python, "-c",
                                  "import os, sys; print('rank', os.environ['RANK'], sys.argv[1:])", "a"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "[rank 1] rank 1 ['a', '--local_rank=1']\n")) << r.out;
}

}  // namespace
}  // namespace deepspeed::launcher

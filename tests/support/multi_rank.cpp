// run_ranks() implementation: spawn (posix_spawn of /proc/self/exe), wait with a deadline,
// collect each rank's exit status and output.
#include "support/multi_rank.h"

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "deepspeed/comm.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

extern char** environ;

namespace deepspeed::testing {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A rank that crashes prints where, so the parent's report shows it.
void print_backtrace_and_die(int sig) {
  void* frames[64];
  int n = ::backtrace(frames, 64);
  const char msg[] = "\nrank process crashed; backtrace:\n";
  ::write(2, msg, sizeof(msg) - 1);
  ::backtrace_symbols_fd(frames, n, 2);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

[[noreturn]] void run_child(const std::function<void(int, int)>& body, const RunOptions& o) {
  int rank = std::atoi(std::getenv("RANK"));
  int world = std::atoi(std::getenv("WORLD_SIZE"));
  int code = 0;
  ::signal(SIGSEGV, print_backtrace_and_die);
  ::signal(SIGABRT, print_backtrace_and_die);
  try {
    comm::InitOptions init;
    init.timeout = std::chrono::milliseconds(o.comm_timeout_ms);
    if (o.init_distributed) comm::init_distributed(init);
    body(rank, world);
    comm::destroy_process_group(/*sync=*/true);
  } catch (const std::exception& e) {
    std::cerr << "rank " << rank << " failed: " << e.what() << std::endl;
    code = 1;
  }
  if (::testing::Test::HasFailure()) code = code ? code : 2;
  std::cout.flush();
  std::cerr.flush();
  std::_Exit(code);
}

}  // namespace

bool in_rank_process() { return std::getenv("DS_TEST_RANK_CHILD") != nullptr; }

std::string rank_output_dir() {
  const char* d = std::getenv("DS_TEST_OUT_DIR");
  return d ? d : "";
}

std::vector<RankResult> run_ranks(int world, const std::function<void(int, int)>& body,
                                  const RunOptions& o) {
  // The n-th run_ranks() of a test runs in processes started for the n-th call: earlier calls
  // return at once in them (see multi_rank.h).
  static std::string counted_test;
  static int calls = 0;
  const auto* current = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test_name =
      std::string(current->test_suite_name()) + "." + current->name();
  if (test_name != counted_test) {
    counted_test = test_name;
    calls = 0;
  }
  const int call = calls++;
  if (in_rank_process()) {
    const char* target = std::getenv("DS_TEST_RUN_INDEX");
    if (target != nullptr && call < std::atoi(target)) return {};
    run_child(body, o);
  }

  static TempDir* dir = nullptr;  // lives until the test binary exits
  dir = new TempDir("ds_ranks");
  ::setenv("DS_TEST_OUT_DIR", dir->path().c_str(), 1);  // the parent reads results here too
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string filter =
      std::string("--gtest_filter=") + info->test_suite_name() + "." + info->name();
  const ReservedPort reserved;  // held until the ranks are done
  const int port = reserved.port();

  std::vector<pid_t> pids(world, -1);
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> env_strings;
    for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
    auto set = [&](const std::string& k, const std::string& v) {
      env_strings.push_back(k + "=" + v);
    };
    set("DS_TEST_RANK_CHILD", "1");
    set("RANK", std::to_string(r));
    set("LOCAL_RANK", std::to_string(r));
    set("WORLD_SIZE", std::to_string(world));
    set("LOCAL_WORLD_SIZE", std::to_string(world));
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", std::to_string(port));
    set("OMP_NUM_THREADS", "1");
    set("DS_TEST_RUN_INDEX", std::to_string(call));
    for (const auto& [k, v] : o.env) set(k, v);
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);

    std::string self = "/proc/self/exe";
    std::vector<std::string> args = {self, filter};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);

    std::string log = dir->path() + "/rank" + std::to_string(r) + ".log";
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      ADD_FAILURE() << "could not start rank " << r << ": " << std::strerror(rc);
      for (pid_t p : pids) if (p > 0) ::kill(p, SIGKILL);
      return {};
    }
    pids[r] = pid;
  }

  std::vector<RankResult> results(world);
  std::vector<bool> done(world, false);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  int remaining = world;
  bool timed_out = false;
  while (remaining > 0) {
    for (int r = 0; r < world; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (::waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        results[r].rank = r;
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].term_signal = WTERMSIG(status);
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      timed_out = true;
      for (int r = 0; r < world; ++r) {
        if (!done[r]) ::kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < world; ++r) {
        if (!done[r]) {
          int status = 0;
          ::waitpid(pids[r], &status, 0);
          results[r].rank = r;
          results[r].term_signal = SIGKILL;
        }
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  bool failed = timed_out;
  for (int r = 0; r < world; ++r) {
    results[r].output = read_file(dir->path() + "/rank" + std::to_string(r) + ".log");
    if (results[r].exit_code != 0) failed = true;
  }
  if (failed && !o.expect_failure) {
    std::ostringstream os;
    os << (timed_out ? "ranks timed out after " + std::to_string(o.timeout_s) + " s\n" : "");
    for (const auto& res : results) {
      os << "---- rank " << res.rank << ": exit " << res.exit_code << " signal "
         << res.term_signal << "\n"
         << res.output << "\n";
    }
    ADD_FAILURE() << "a rank failed:\n" << os.str();
  }
  return results;
}

}  // namespace deepspeed::testing

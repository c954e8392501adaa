// LaunchPlan -> one ChildSpec per rank: see local_runner.h.
#include "local_runner.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "line_prefixer.h"
#include "process_runner.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

void make_directories(const std::string& dir) {
  std::size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    std::string partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0755) != 0 && errno != EEXIST) {
      throw UsageError("--enable_each_rank_log " + dir + ": cannot create " + partial + ": " + std::strerror(errno));
    }
  }
}

std::string timestamp_now() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y%m%d%H%M%S", &local);  // DeepSpeed's log name prefix
  return buffer;
}

}  // namespace

int run_local(const LaunchPlan& plan, const LocalRunOptions& options) {
  std::string stamp;
  if (!options.each_rank_log_dir.empty()) {
    make_directories(options.each_rank_log_dir);
    stamp = timestamp_now();
  }
  std::vector<ChildSpec> children;
  for (const RankLaunch& rank : plan.ranks) {
    ChildSpec child;
    child.label = "rank " + std::to_string(rank.rank);
    child.output_prefix = rank_prefix(rank.rank);
    child.exec_path = plan.program_path;
    child.argv = rank.argv;
    child.env = rank.env;
    child.cpu_cores = rank.cpu_cores;
    if (!stamp.empty()) {
      child.log_path = options.each_rank_log_dir + "/" + stamp + "_rank" + std::to_string(rank.rank) + ".log";
    }
    children.push_back(std::move(child));
  }
  RunnerOptions runner;
  runner.kill_grace_s = options.kill_grace_s;
  runner.unit = "rank";
  runner.controlled_by_stdin = options.controlled_by_stdin;
  return run_processes(children, runner);
}

}  // namespace deepspeed::launcher

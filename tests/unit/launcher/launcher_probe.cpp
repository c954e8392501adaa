// launcher_probe: the rank program of the launcher's end-to-end tests. Prints the environment the
// launcher gave it and its arguments, then does what its --flags say for its rank (sleep, exit
// with a code, kill itself, spam output...). Writes with write(2) so nothing sits in a buffer.
//
// Output (stdout): "env NAME=value" per variable, "arg <i>=<value>" per argument, "affinity <list>",
// then "ready". Flags take the form --name=RANK:VALUE, where RANK is a rank number or '*':
// --ignore_sigterm (all ranks), --show_env (NAME,NAME: print more variables), --pid_dir,
// --wait_for_file, --check_pid_file (all ranks), --stderr, --spam, --sleep_s, --kill_self,
// --no_newline, --exit_code; applied in that order.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

void put(int fd, const std::string& text) {
  std::string_view rest = text;
  while (!rest.empty()) {
    ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    rest.remove_prefix(static_cast<std::size_t>(n));
  }
}

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : fallback;
}

// "--name=R:V" for this rank (or '*') -> V; "" if the flag is absent or names another rank.
std::string flag_for_rank(const std::vector<std::string>& args, const std::string& name, int rank) {
  std::string prefix = "--" + name + "=";
  std::string result;
  for (const std::string& arg : args) {
    if (arg.rfind(prefix, 0) != 0) continue;
    std::string spec = arg.substr(prefix.size());
    std::size_t colon = spec.find(':');
    if (colon == std::string::npos) continue;
    std::string who = spec.substr(0, colon);
    if (who == "*" || who == std::to_string(rank)) result = spec.substr(colon + 1);
  }
  return result;
}

bool has_flag(const std::vector<std::string>& args, const std::string& name) {
  for (const std::string& arg : args) {
    if (arg == "--" + name) return true;
  }
  return false;
}

std::string affinity_text() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return "?";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (!out.empty()) out += ',';
    out += std::to_string(cpu);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // First, so a SIGTERM arriving during the test's setup is already ignored.
  if (has_flag(args, "ignore_sigterm")) ::signal(SIGTERM, SIG_IGN);
  const int rank = std::atoi(env_or("RANK", "-1").c_str());

  std::string report;
  for (const char* name : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_SIZE",
                           "CROSS_RANK", "CROSS_SIZE", "MASTER_ADDR", "MASTER_PORT",
                           "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "PYTHONUNBUFFERED"}) {
    report += std::string("env ") + name + "=" + env_or(name, "<unset>") + "\n";
  }
  std::string extra = flag_for_rank(args, "show_env", rank);
  for (std::size_t start = 0; !extra.empty() && start <= extra.size();) {
    std::size_t comma = extra.find(',', start);
    std::string name = extra.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    report += "env " + name + "=" + env_or(name.c_str(), "<unset>") + "\n";
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (std::size_t i = 0; i < args.size(); ++i) report += "arg " + std::to_string(i) + "=" + args[i] + "\n";
  report += "affinity " + affinity_text() + "\n";
  put(STDOUT_FILENO, report);

  std::string pid_dir = flag_for_rank(args, "pid_dir", rank);
  if (!pid_dir.empty()) {
    // Written then renamed, so a peer waiting for the file never reads it half-written.
    std::string path = pid_dir + "/rank" + std::to_string(rank) + ".pid";
    std::ofstream(path + ".tmp") << ::getpid();
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  // Lets a test order ranks: e.g. rank 1 fails only once rank 0 is up (its pid file exists).
  std::string wait_for = flag_for_rank(args, "wait_for_file", rank);
  for (int i = 0; !wait_for.empty() && i < 2000 && ::access(wait_for.c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (has_flag(args, "check_pid_file")) {
    std::string path = "/tmp/" + std::to_string(::getppid()) + ".deepspeed";
    std::ifstream in(path);
    std::stringstream content;
    content << in.rdbuf();
    put(STDOUT_FILENO, "pid_file " + (in ? content.str() : std::string("<missing>")) + "\n");
  }
  std::string err_text = flag_for_rank(args, "stderr", rank);
  if (!err_text.empty()) put(STDERR_FILENO, err_text + "\n");

  std::string spam = flag_for_rank(args, "spam", rank);
  if (!spam.empty()) {
    // Each line goes out in two write() calls, so the launcher sees half lines from both ranks.
    const std::string body(200, static_cast<char>('a' + (rank % 26)));
    for (int i = 0, n = std::atoi(spam.c_str()); i < n; ++i) {
      std::string line = "spam rank=" + std::to_string(rank) + " i=" + std::to_string(i) + " " + body + "\n";
      std::size_t half = line.size() / 2;
      put(STDOUT_FILENO, line.substr(0, half));
      put(STDOUT_FILENO, line.substr(half));
    }
  }
  put(STDOUT_FILENO, "ready\n");

  std::string sleep_s = flag_for_rank(args, "sleep_s", rank);
  if (!sleep_s.empty()) std::this_thread::sleep_for(std::chrono::duration<double>(std::atof(sleep_s.c_str())));
  std::string kill_self = flag_for_rank(args, "kill_self", rank);
  if (!kill_self.empty()) {
    int sig = std::atoi(kill_self.c_str());
    ::signal(sig, SIG_DFL);
    ::kill(::getpid(), sig);
    std::this_thread::sleep_for(std::chrono::seconds(5));
  }
  std::string tail = flag_for_rank(args, "no_newline", rank);
  if (!tail.empty()) put(STDOUT_FILENO, tail);
  std::string code = flag_for_rank(args, "exit_code", rank);
  return code.empty() ? 0 : std::atoi(code.c_str());
}

// Process and temp-dir helpers for the launcher e2e tests: see test_process.h.
#include "test_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace deepspeed::launcher::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/ds_launcher_test.XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr) {
    throw std::runtime_error("mkdtemp(" + pattern + "): " + std::strerror(errno));
  }
  path_ = buffer.data();
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream content;
  content << in.rdbuf();
  return content.str();
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t newline = text.find('\n', start);
    if (newline == std::string::npos) {
      lines.push_back(text.substr(start));
      break;
    }
    lines.push_back(text.substr(start, newline - start));
    start = newline + 1;
  }
  return lines;
}

bool process_alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  // A zombie still answers kill(0); /proc tells it apart.
  std::string stat = read_file("/proc/" + std::to_string(pid) + "/stat");
  std::size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
}

std::string required_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') {
    throw std::runtime_error(std::string(name) + " is not set; run this test through ctest, whose "
                             "CMakeLists.txt passes the binaries' paths");
  }
  return value;
}

TestProcess::TestProcess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env,
                         std::vector<std::string> unset, std::string cwd, bool pipe_stdin) {
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string kv(*entry);
    std::string key = kv.substr(0, kv.find('='));
    bool drop = false;
    for (const auto& [k, v] : env) drop = drop || k == key;
    for (const auto& k : unset) drop = drop || k == key;
    if (!drop) env_strings.push_back(kv);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  std::string out_path = dir_.path() + "/stdout";
  std::string err_path = dir_.path() + "/stderr";

  int in_pipe[2] = {-1, -1};
  if (pipe_stdin && ::pipe2(in_pipe, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  start_s_ = monotonic_seconds();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid_ == 0) {
    if (pipe_stdin) ::dup2(in_pipe[0], STDIN_FILENO);
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) ::_exit(126);
    int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out, STDOUT_FILENO);
    ::dup2(err, STDERR_FILENO);
    ::execve(args[0], args.data(), envp.data());
    std::string message = std::string("exec ") + args[0] + ": " + std::strerror(errno) + "\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, message.data(), message.size());
    ::_exit(127);
  }
  if (pipe_stdin) {
    ::close(in_pipe[0]);
    stdin_fd_ = in_pipe[1];
  }
}

bool TestProcess::write_stdin(const std::string& text) {
  ::signal(SIGPIPE, SIG_IGN);  // a process that stopped reading must fail the write, not the test
  return stdin_fd_ >= 0 && ::write(stdin_fd_, text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

void TestProcess::close_stdin() {
  if (stdin_fd_ >= 0) ::close(stdin_fd_);
  stdin_fd_ = -1;
}

TestProcess::~TestProcess() {
  close_stdin();
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
}

std::string TestProcess::stdout_text() const { return read_file(dir_.path() + "/stdout"); }
std::string TestProcess::stderr_text() const { return read_file(dir_.path() + "/stderr"); }

bool TestProcess::wait_for_stdout(const std::string& needle, int count, double timeout_s) const {
  const double deadline = monotonic_seconds() + timeout_s;
  while (monotonic_seconds() < deadline) {
    std::string text = stdout_text();
    int found = 0;
    for (std::size_t pos = text.find(needle); pos != std::string::npos; pos = text.find(needle, pos + 1)) ++found;
    if (found >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

ProcessResult TestProcess::wait(double timeout_s) {
  ProcessResult result;
  const double deadline = start_s_ + timeout_s;
  int status = 0;
  while (true) {
    pid_t done = ::waitpid(pid_, &status, WNOHANG);
    if (done == pid_) break;
    if (monotonic_seconds() > deadline) {
      result.timed_out = true;
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  reaped_ = true;
  result.elapsed_s = monotonic_seconds() - start_s_;
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.term_signal = WTERMSIG(status);
  result.out = stdout_text();
  result.err = stderr_text();
  return result;
}

ProcessResult run_process(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env,
                          double timeout_s, std::string cwd) {
  TestProcess process(std::move(argv), std::move(env), {}, std::move(cwd));
  return process.wait(timeout_s);
}

}  // namespace deepspeed::launcher::testing

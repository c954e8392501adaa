// Test helpers for the launcher's end-to-end tests: start a process with extra environment, its
// stdout and stderr captured to files, wait for it under a timeout, and a self-removing temp dir.
// Files, not pipes, so the test needs no reader thread and can peek at output while it runs.
#pragma once

#include <sys/types.h>

#include <string>
#include <utility>
#include <vector>

namespace deepspeed::launcher::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct ProcessResult {
  int exit_code = -1;    // valid when term_signal == 0
  int term_signal = 0;   // signal that killed the process, 0 if it exited
  bool timed_out = false;
  double elapsed_s = 0;  // from start to exit
  std::string out;       // everything written to stdout
  std::string err;       // everything written to stderr
};

class TestProcess {
 public:
  // Starts `argv` (argv[0] a path) with the test's environment plus `env` (overriding) minus
  // `unset`, in directory `cwd` ("" = the test's). With `pipe_stdin` its stdin is a pipe the test
  // writes with write_stdin() and closes with close_stdin(); otherwise it inherits the test's.
  // Throws std::runtime_error if it cannot fork.
  TestProcess(std::vector<std::string> argv, std::vector<std::pair<std::string, std::string>> env = {},
              std::vector<std::string> unset = {}, std::string cwd = {}, bool pipe_stdin = false);
  // SIGKILLs the process if it is still running.
  ~TestProcess();
  TestProcess(const TestProcess&) = delete;
  TestProcess& operator=(const TestProcess&) = delete;

  pid_t pid() const { return pid_; }
  std::string stdout_text() const;
  std::string stderr_text() const;

  // Polls stdout until `needle` occurs `count` times; false after `timeout_s`.
  bool wait_for_stdout(const std::string& needle, int count, double timeout_s) const;

  // Waits for exit; after `timeout_s` SIGKILLs it and reports timed_out.
  ProcessResult wait(double timeout_s);

  // The stdin pipe (pipe_stdin only): false if the process no longer reads it.
  bool write_stdin(const std::string& text);
  void close_stdin();

 private:
  TempDir dir_;
  int stdin_fd_ = -1;
  pid_t pid_ = -1;
  bool reaped_ = false;
  double start_s_ = 0;
};

// Starts and waits in one call (in directory `cwd` when given).
ProcessResult run_process(std::vector<std::string> argv,
                          std::vector<std::pair<std::string, std::string>> env = {},
                          double timeout_s = 20, std::string cwd = {});

// Value of an environment variable the test's CMake sets (binary paths). Throws
// std::runtime_error naming it when missing, so a misconfigured run fails loudly.
std::string required_env(const char* name);

double monotonic_seconds();

std::string read_file(const std::string& path);

// Splits into lines without their '\n'; a final unterminated piece is kept.
std::vector<std::string> split_lines(const std::string& text);

// Whether a process with this pid still exists (zombies count as gone: they no longer run).
bool process_alive(pid_t pid);

}  // namespace deepspeed::launcher::testing

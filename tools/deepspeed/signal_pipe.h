// SignalPipe: turns asynchronous signals (SIGCHLD, SIGINT, SIGTERM) into bytes on a pipe that the
// launcher's poll() loop watches next to the ranks' output pipes (the self-pipe trick). This is
// what lets the launcher react to a dying rank at once instead of polling every second.
#pragma once

#include <csignal>
#include <initializer_list>
#include <vector>

namespace deepspeed::launcher {

class SignalPipe {
 public:
  // Installs handlers for `signals` (and ignores SIGPIPE, so a closed stdout cannot kill the
  // launcher and orphan the ranks). Only one SignalPipe may exist at a time. Throws
  // std::system_error if the pipe cannot be created.
  explicit SignalPipe(std::initializer_list<int> signals);
  // Restores the previous handlers.
  ~SignalPipe();
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  // Read end, non-blocking and close-on-exec: poll() it for POLLIN.
  int fd() const { return read_fd_; }

  // Returns the signals received since the last call, in arrival order (empty if none).
  std::vector<int> drain();

  // Handlers a freshly forked child must reset before exec(): those installed here and SIGPIPE.
  // Async-signal-safe.
  void reset_in_child() const;

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;
  struct sigaction previous_sigpipe_{};
};

}  // namespace deepspeed::launcher

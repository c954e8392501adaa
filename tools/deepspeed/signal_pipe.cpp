// Self-pipe signal delivery: see signal_pipe.h.
#include "signal_pipe.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace deepspeed::launcher {
namespace {

volatile sig_atomic_t g_write_fd = -1;

void on_signal(int sig) {
  int saved_errno = errno;
  unsigned char byte = static_cast<unsigned char>(sig);
  // Non-blocking: if the pipe were ever full the byte is dropped; SIGCHLD handling re-checks
  // every rank anyway, and the pipe holds thousands of pending signals.
  [[maybe_unused]] ssize_t n = ::write(g_write_fd, &byte, 1);
  errno = saved_errno;
}

}  // namespace

SignalPipe::SignalPipe(std::initializer_list<int> signals) : signals_(signals) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw std::system_error(errno, std::generic_category(), "deepspeed: creating the signal pipe");
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  g_write_fd = write_fd_;

  struct sigaction action{};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  previous_.resize(signals_.size());
  for (std::size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &action, &previous_[i]);

  struct sigaction ignore{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGPIPE, &ignore, &previous_sigpipe_);
}

SignalPipe::~SignalPipe() {
  for (std::size_t i = 0; i < signals_.size(); ++i) ::sigaction(signals_[i], &previous_[i], nullptr);
  ::sigaction(SIGPIPE, &previous_sigpipe_, nullptr);
  g_write_fd = -1;
  ::close(read_fd_);
  ::close(write_fd_);
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> received;
  unsigned char buffer[64];
  while (true) {
    ssize_t n = ::read(read_fd_, buffer, sizeof(buffer));
    if (n > 0) {
      received.insert(received.end(), buffer, buffer + n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;  // EAGAIN: nothing more pending
  }
  return received;
}

void SignalPipe::reset_in_child() const {
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig : signals_) ::sigaction(sig, &dfl, nullptr);
  // An ignored SIGPIPE survives exec(); the rank must get the default behaviour.
  ::sigaction(SIGPIPE, &dfl, nullptr);
}

}  // namespace deepspeed::launcher

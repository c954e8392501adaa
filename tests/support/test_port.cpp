// ReservedPort: probe ports from a per-process starting point; take the first whose lock file
// this process can flock and which binds on every address, as the job's TCP store will.
#include "support/test_port.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace deepspeed::testing {
namespace {

// Per user: another user's lock files (root's, from CI) could not be opened for writing.
std::string lock_directory() {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("deepspeed-cpp-test-ports-" + std::to_string(::getuid()));
  std::error_code ignored;
  std::filesystem::create_directories(dir, ignored);
  return dir.string();
}

// SO_REUSEADDR as c10d's store sets it: a port in TIME_WAIT from an earlier job counts as free.
bool binds_now(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const int on = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// A lock fd when this process now holds `port`'s lock, -1 otherwise. The lock belongs to the
// open file description: a second reservation of the same port in this process fails too.
int try_lock(const std::string& dir, int port) {
  const std::string path = dir + "/" + std::to_string(port);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return -1;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// A process's reservations follow each other, so it never probes its own held ports again; the
// first starts at a point spread by the process id.
int next_candidate = -1;

int process_candidate() {
  if (next_candidate >= 0) return next_candidate;
  return kFirstTestPort + static_cast<int>((::getpid() * 97L) % (kLastTestPort - kFirstTestPort));
}

}  // namespace

ReservedPort::ReservedPort() : ReservedPort(process_candidate()) {}

ReservedPort::ReservedPort(int first_candidate) {
  static const std::string dir = lock_directory();
  constexpr int kSpan = kLastTestPort - kFirstTestPort;
  int offset = ((first_candidate - kFirstTestPort) % kSpan + kSpan) % kSpan;
  for (int tried = 0; tried < kSpan; ++tried, offset = (offset + 1) % kSpan) {
    const int port = kFirstTestPort + offset;
    const int fd = try_lock(dir, port);
    if (fd < 0) continue;
    if (!binds_now(port)) {
      ::close(fd);
      continue;
    }
    port_ = port;
    lock_fd_ = fd;
    next_candidate = kFirstTestPort + (offset + 1) % kSpan;
    return;
  }
  throw std::runtime_error("no free test port in [" + std::to_string(kFirstTestPort) + ", " +
                           std::to_string(kLastTestPort) + ") (lock files in " + dir + ")");
}

ReservedPort::~ReservedPort() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

ReservedPort::ReservedPort(ReservedPort&& other) noexcept
    : port_(other.port_), lock_fd_(other.lock_fd_) {
  other.lock_fd_ = -1;
}

ListeningSocket::ListeningSocket(int port)
    : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ok_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
        ::listen(fd_, 1) == 0;
}

ListeningSocket::~ListeningSocket() {
  if (fd_ >= 0) ::close(fd_);
}

int reserve_port() {
  static std::vector<ReservedPort>* held = new std::vector<ReservedPort>();  // until exit
  held->emplace_back();
  return held->back().port();
}

}  // namespace deepspeed::testing

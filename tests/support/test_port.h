// Master ports for the jobs that tests start, reserved across every test process running at once.
//
// ctest runs test binaries side by side, and each starts jobs whose rank 0 binds a TCP store on
// MASTER_PORT. Ports picked from the process id (or from the kernel, then closed) could collide
// with a concurrent test's, or be taken by an outgoing connection in the ephemeral range, and a
// rendezvous would fail with "Address already in use". A reservation is an flock on a per-port
// file under the temp directory (held by this process only: close-on-exec) plus a check that the
// port binds now; ports are drawn from below the ephemeral range.
#pragma once

namespace deepspeed::testing {

/// A reserved port, released on destruction (the lock is dropped; nothing else changes).
class ReservedPort {
 public:
  /// The next port after this process's last reservation (the first one: from the process id).
  ReservedPort();
  /// The first free port from `first_candidate` on, wrapping within the range.
  explicit ReservedPort(int first_candidate);
  ~ReservedPort();
  ReservedPort(ReservedPort&& other) noexcept;
  ReservedPort& operator=(ReservedPort&&) = delete;
  ReservedPort(const ReservedPort&) = delete;
  ReservedPort& operator=(const ReservedPort&) = delete;

  int port() const { return port_; }

 private:
  int port_ = 0;
  int lock_fd_ = -1;
};

/// A socket listening on `port` on every IPv4 address, as an unrelated server would hold it
/// (no reservation): tests of code that must cope with a port in use.
class ListeningSocket {
 public:
  explicit ListeningSocket(int port);
  ~ListeningSocket();
  ListeningSocket(const ListeningSocket&) = delete;
  ListeningSocket& operator=(const ListeningSocket&) = delete;

  /// Whether it is bound and listening.
  bool ok() const { return ok_; }

 private:
  int fd_;
  bool ok_ = false;
};

/// A port reserved until this process exits: for tests that start a job and read its output.
int reserve_port();

/// Where reservations are drawn from: [first, last). Below Linux's default ephemeral range
/// (32768-60999) and above the autotuning test's experiment ports.
inline constexpr int kFirstTestPort = 27400;
inline constexpr int kLastTestPort = 32700;

}  // namespace deepspeed::testing

// ReservedPort: a port is not handed out twice while reserved (by this process or another), a
// port that something else has bound is skipped, and a released port can be reserved again.
#include "support/test_port.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace deepspeed::testing {
namespace {

TEST(ReservedPort, IsInTheRangeAndNotHandedOutTwiceWhileHeld) {
  const ReservedPort first;
  EXPECT_GE(first.port(), kFirstTestPort);
  EXPECT_LT(first.port(), kLastTestPort);
  const ReservedPort again(first.port());
  EXPECT_NE(again.port(), first.port());
  EXPECT_NE(reserve_port(), first.port());
}

TEST(ReservedPort, AnotherProcessSkipsAHeldPort) {
  const ReservedPort held;
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A new process asks for exactly the parent's port; the lock is the parent's.
    ::close(pipe_fds[0]);
    const int got = ReservedPort(held.port()).port();
    (void)!::write(pipe_fds[1], &got, sizeof(got));
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  int got = 0;
  ASSERT_EQ(::read(pipe_fds[0], &got, sizeof(got)), static_cast<ssize_t>(sizeof(got)));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_NE(got, held.port());
}

TEST(ReservedPort, SkipsAPortThatIsBoundElsewhere) {
  int busy = 0;
  {
    const ReservedPort probe;  // a port that binds now, released again below
    busy = probe.port();
  }
  const ListeningSocket server(busy);
  ASSERT_TRUE(server.ok()) << busy;
  const ReservedPort port(busy);
  EXPECT_NE(port.port(), busy);
}

TEST(ReservedPort, IsFreeAgainOnceReleased) {
  int port = 0;
  {
    const ReservedPort first;
    port = first.port();
  }
  EXPECT_EQ(ReservedPort(port).port(), port);
}

}  // namespace
}  // namespace deepspeed::testing

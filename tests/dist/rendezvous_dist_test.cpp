// Rendezvous (src/comm/rendezvous.h): a rank that leaves before init_distributed is named by
// the ranks that arrived, with MASTER_ADDR/PORT and the timeout, after one timeout (not two).
#include "deepspeed/comm.h"

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

TEST(RendezvousDist, RankThatNeverArrivesIsNamedAfterOneTimeout) {
  testing::RunOptions o;
  o.init_distributed = false;
  o.timeout_s = 60;
  auto results = run_ranks(
      3,
      [](int rank, int) {
        if (rank == 2) return;  // leaves before the rendezvous
        comm::InitOptions init;
        init.timeout = std::chrono::milliseconds(3000);
        const auto start = std::chrono::steady_clock::now();
        std::string message;
        try {
          comm::init_distributed(init);
        } catch (const CommError& e) {
          message = e.what();
        }
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::printf("rendezvous failed after %.2f s: %s\n", seconds, message.c_str());
        EXPECT_NE(message.find("[rank " + std::to_string(rank) +
                               "/3] rendezvous at MASTER_ADDR=127.0.0.1 MASTER_PORT="),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("rank 2 of 3 never arrived within the timeout of 3 s"),
                  std::string::npos)
            << message;
        EXPECT_NE(message.find("\n  rank 0: "), std::string::npos) << message;  // arrived
        EXPECT_EQ(message.find("\n  rank 2: "), std::string::npos) << message;
        // One timeout: the store's wait and Gloo's connect used to take one each.
        EXPECT_GE(seconds, 2.5);
        EXPECT_LT(seconds, 5.0);
      },
      o);
  ASSERT_EQ(results.size(), 3u);
}

}  // namespace
}  // namespace deepspeed

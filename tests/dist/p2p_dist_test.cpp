// comm::send / recv / isend / irecv on 2 and 4 Gloo ranks: payloads of every dtype the pipeline
// moves arrive intact and in order, peers are global ranks of a sub-group, a size mismatch is a
// CommError naming both sides (the sender still completes), and bad peers are refused.
#include "deepspeed/comm.h"
#include "deepspeed/comm_p2p.h"
#include "deepspeed/parallel_groups.h"
#include "deepspeed/topology.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

TEST(P2pDist, PingPongOfEveryDtypeArrivesIntact) {
  run_ranks(2, [](int rank, int) {
    const int peer = 1 - rank;
    for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kLong}) {
      for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4097}}) {
        auto want = (torch::arange(n, torch::kFloat) * 3 + 1).to(dtype);
        if (rank == 0) {
          comm::send(want, peer);
          auto back = torch::empty({n}, dtype);
          comm::recv(back, peer);
          EXPECT_TRUE(torch::equal(back, want * 2)) << dtype << " n=" << n;
        } else {
          auto got = torch::empty({n}, dtype);
          comm::recv(got, peer);
          EXPECT_TRUE(torch::equal(got, want)) << dtype << " n=" << n;
          auto twice = got * 2;
          comm::send(twice, peer);
        }
      }
    }
    // A collective after point-to-point calls still agrees (p2p is not counted as one).
    auto t = torch::ones({3});
    comm::all_reduce(t);
    EXPECT_EQ(t[0].item<float>(), 2.0f);
  });
}

TEST(P2pDist, AsyncMessagesKeepTheirOrderPerTag) {
  run_ranks(2, [](int rank, int) {
    const int peer = 1 - rank;
    constexpr int kMessages = 4;
    std::vector<at::Tensor> bufs;
    std::vector<comm::Handle> handles;
    // Both ranks post first (sends on tag 0, receives on tag 1 and vice versa): no deadlock
    // because nothing waits before everything is posted.
    for (int i = 0; i < kMessages; ++i) {
      if (rank == 0) {
        bufs.push_back(torch::full({16}, static_cast<float>(i)));
        handles.push_back(comm::isend(bufs.back(), peer, comm::world(), 0));
      } else {
        bufs.push_back(torch::empty({16}));
        handles.push_back(comm::irecv(bufs.back(), peer, comm::world(), 0));
      }
    }
    auto other = rank == 0 ? torch::empty({5}) : torch::full({5}, 9.0f);
    auto h = rank == 0 ? comm::irecv(other, peer, comm::world(), 1)
                       : comm::isend(other, peer, comm::world(), 1);
    h.wait();
    for (auto it = handles.rbegin(); it != handles.rend(); ++it) it->wait();
    for (int i = 0; i < kMessages; ++i) EXPECT_EQ(bufs[i][3].item<float>(), i);
    EXPECT_EQ(other[4].item<float>(), 9.0f);
  });
}

// Pipe x data = 2 x 2: ranks 0,1 are stage 0 and ranks 2,3 stage 1; each data-parallel replica
// passes along its own pipe group, addressing the peer by global rank.
TEST(P2pDist, SendsAlongThePipeGroupsOfATopology) {
  run_ranks(4, [](int rank, int) {
    comm::ParallelGroups groups(PipeDataParallelTopology(2, 2));
    const comm::Group& pipe = groups.pipe();
    ASSERT_EQ(pipe.size(), 2);
    const int stage = groups.coord("pipe");
    const int peer = pipe.global_rank(1 - stage);
    auto t = torch::full({33}, static_cast<float>(rank));
    if (stage == 0) {
      comm::send(t, peer, pipe);
    } else {
      comm::recv(t, peer, pipe);
      EXPECT_EQ(t[0].item<float>(), static_cast<float>(peer));
    }
    // A rank of another pipe group is not a valid peer on this one.
    const int stranger = groups.data().global_rank(1 - groups.coord("data"));
    EXPECT_THROW_WITH(comm::send(t, stranger, pipe), UsageError, "is not a member of group");
    EXPECT_THROW_WITH(comm::send(t, rank, comm::world()), UsageError, "is this rank");
    EXPECT_THROW_WITH(comm::send(t, peer, pipe, -1), UsageError, "tag -1");
  });
}

TEST(P2pDist, SizeMismatchNamesBothSidesAndTheSenderCompletes) {
  run_ranks(2, [](int rank, int) {
    if (rank == 0) {
      auto t = torch::ones({8});
      comm::send(t, 1);  // completes: the receiver drains the message before it throws
    } else {
      auto t = torch::zeros({4});
      EXPECT_THROW_WITH(comm::recv(t, 0), CommError, "rank 0 sent 8 x float");
      EXPECT_EQ(t.sum().item<float>(), 0.0f);  // nothing was written
      // Ranks stay usable: the next exchange has matching sizes.
    }
    auto ok = torch::full({2}, static_cast<float>(rank));
    if (rank == 0) {
      comm::send(ok, 1, comm::world(), 3);
    } else {
      comm::recv(ok, 0, comm::world(), 3);
      EXPECT_EQ(ok[1].item<float>(), 0.0f);
    }
  });
}

TEST(P2pDist, DtypeMismatchIsReported) {
  run_ranks(2, [](int rank, int) {
    if (rank == 0) {
      auto t = torch::ones({6}, torch::kBFloat16);
      comm::send(t, 1);
    } else {
      auto t = torch::zeros({6});
      EXPECT_THROW_WITH(comm::recv(t, 0), CommError, "sent 6 x bfloat16");
    }
  });
}

TEST(P2pDist, ATimeoutNamesThePeerThatNeverSent) {
  testing::RunOptions o;
  o.comm_timeout_ms = 2000;
  run_ranks(
      2,
      [](int rank, int) {
        if (rank == 1) {
          auto t = torch::zeros({4});
          EXPECT_THROW_WITH(comm::recv(t, 0), CommError, "rank 0 never sent the matching message");
        }
        // Rank 0 sends nothing.
      },
      o);
}

}  // namespace
}  // namespace deepspeed

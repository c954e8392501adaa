// deepspeed::comm collectives on 2 and 4 Gloo ranks, and the cross-rank timeout report.
#include "deepspeed/comm.h"

#include <fstream>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

// Awkward sizes: 1 element, not divisible by the world size, and 4097.
void check_collectives(int rank, int world) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{4097}}) {
    auto t = torch::full({n}, static_cast<float>(rank + 1));
    comm::all_reduce(t);
    EXPECT_TRUE(torch::allclose(t, torch::full({n}, world * (world + 1) / 2.0f))) << n;

    auto avg = torch::full({n}, static_cast<float>(rank));
    comm::all_reduce(avg, comm::ReduceOp::kAvg);
    EXPECT_TRUE(torch::allclose(avg, torch::full({n}, (world - 1) / 2.0f))) << n;

    auto mx = torch::full({n}, static_cast<float>(rank));
    comm::all_reduce(mx, comm::ReduceOp::kMax);
    EXPECT_EQ(mx[0].item<float>(), world - 1);

    auto in = torch::arange(n, torch::kFloat) + 1000.0f * rank;
    auto out = torch::empty({n * world});
    comm::all_gather(out, in);
    for (int r = 0; r < world; ++r) {
      EXPECT_TRUE(torch::equal(out.narrow(0, r * n, n), torch::arange(n, torch::kFloat) + 1000.0f * r));
    }

    auto rs_in = torch::arange(n * world, torch::kFloat) * (rank + 1);
    auto rs_out = torch::empty({n});
    comm::reduce_scatter(rs_out, rs_in);
    float factor = world * (world + 1) / 2.0f;
    EXPECT_TRUE(torch::allclose(rs_out, torch::arange(rank * n, (rank + 1) * n, torch::kFloat) * factor));
    // bf16 (no Gloo kernel in LibTorch 1.13): reduced in fp32, rounded once.
    auto rs_bf16 = torch::empty({n}, torch::kBFloat16);
    comm::reduce_scatter(rs_bf16, rs_in.to(torch::kBFloat16));
    auto want = torch::zeros({n * world});
    for (int r = 0; r < world; ++r) {
      want += (torch::arange(n * world, torch::kFloat) * (r + 1)).to(torch::kBFloat16).to(torch::kFloat);
    }
    EXPECT_TRUE(torch::equal(rs_bf16, want.narrow(0, rank * n, n).to(torch::kBFloat16)));

    auto b = rank == 1 ? torch::full({n}, 42.0f) : torch::zeros({n});
    comm::broadcast(b, 1);
    EXPECT_TRUE(torch::equal(b, torch::full({n}, 42.0f)));
  }
  // Async: several in flight, completed out of order.
  auto a = torch::ones({1000});
  auto c = torch::ones({10});
  auto ha = comm::all_reduce(a, comm::ReduceOp::kSum, true);
  auto hc = comm::all_reduce(c, comm::ReduceOp::kSum, true);
  hc.wait();
  ha.wait();
  EXPECT_EQ(a[999].item<float>(), world);
  EXPECT_EQ(c[0].item<float>(), world);
  comm::barrier();
  EXPECT_EQ(comm::get_rank(), rank);
  EXPECT_EQ(comm::get_world_size(), world);
  EXPECT_GT(comm::sequence_number(), 0);
}

TEST(CommDist, CollectivesOnTwoRanks) { run_ranks(2, check_collectives); }

TEST(CommDist, CollectivesOnFourRanks) { run_ranks(4, check_collectives); }

TEST(CommDist, TimeoutReportNamesTheRankThatNeverIssuedTheCollective) {
  testing::RunOptions o;
  o.comm_timeout_ms = 3000;
  run_ranks(
      2,
      [](int rank, int) {
        auto t = torch::ones({16});
        comm::all_reduce(t);  // #1 on both ranks
        if (rank == 1) {
          // Rank 1 skips the next collective and waits for rank 0 to give up.
          std::this_thread::sleep_for(std::chrono::seconds(6));
          std::_Exit(0);
        }
        std::string message;
        {
          comm::PhaseScope phase(comm::Phase::kBackward);
          try {
            comm::all_reduce(t);
          } catch (const CommError& e) {
            message = e.what();
          }
        }
        std::ofstream(testing::rank_output_dir() + "/report.txt") << message;
        std::_Exit(0);
      },
      o);
  std::ifstream in(testing::rank_output_dir() + "/report.txt");
  std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("[rank 0/2] collective #2 all_reduce (16 x float, phase backward)"),
            std::string::npos) << report;
  EXPECT_NE(report.find("ranks [1] never issued collective #2"), std::string::npos) << report;
  EXPECT_NE(report.find("rank 1: last issued #1 all_reduce"), std::string::npos) << report;
}

TEST(CommDist, SingleProcessWithoutEnvironmentIsWorldOfOne) {
  comm::init_distributed();
  EXPECT_EQ(comm::get_world_size(), 1);
  auto t = torch::ones({3});
  comm::all_reduce(t);
  EXPECT_TRUE(torch::equal(t, torch::ones({3})));
  auto out = torch::empty({3});
  comm::all_gather(out, torch::full({3}, 2.0f));
  EXPECT_TRUE(torch::equal(out, torch::full({3}, 2.0f)));
}

}  // namespace
}  // namespace deepspeed

// comm::Group on 4 and 8 Gloo ranks: new_group() made the same way on every rank, collectives on
// sub-groups (sums, gathers in group order, src/dst as global ranks), non-members refused, a
// disagreement between members caught, and a timeout report that names the group. Then
// ParallelGroups / TopologyMpu: every rank agrees on every group of a topology.
#include "deepspeed/comm.h"
#include "deepspeed/comms_logging.h"
#include "deepspeed/mpu.h"
#include "deepspeed/parallel_groups.h"

#include <fstream>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

float sum_of(const std::vector<int>& ranks, float offset) {
  float s = 0.0f;
  for (int r : ranks) s += static_cast<float>(r) + offset;
  return s;
}

// Every collective on `g` from this rank (a member): the results depend only on the members'
// global ranks, so each member can check them alone.
void check_group_collectives(const comm::Group& g, int rank) {
  const int size = g.size();
  const std::vector<int>& ranks = g.ranks();
  ASSERT_EQ(g.ranks().at(static_cast<size_t>(g.rank())), rank) << g.describe();
  for (int64_t n : {int64_t{1}, int64_t{5}, int64_t{1031}}) {
    auto t = torch::full({n}, static_cast<float>(rank + 1));
    comm::all_reduce(t, comm::ReduceOp::kSum, false, g);
    EXPECT_TRUE(torch::equal(t, torch::full({n}, sum_of(ranks, 1.0f)))) << g.describe();

    auto avg = torch::full({n}, static_cast<float>(rank));
    comm::all_reduce(avg, comm::ReduceOp::kAvg, false, g);
    EXPECT_TRUE(torch::allclose(avg, torch::full({n}, sum_of(ranks, 0.0f) / size)))
        << g.describe();

    // Slices land in group order (the order given to new_group), not in global-rank order.
    auto in = torch::arange(n, torch::kFloat) + 1000.0f * rank;
    auto out = torch::empty({n * size});
    comm::all_gather(out, in, false, g);
    for (int i = 0; i < size; ++i) {
      EXPECT_TRUE(torch::equal(out.narrow(0, i * n, n),
                               torch::arange(n, torch::kFloat) + 1000.0f * ranks[i]))
          << g.describe() << " slice " << i;
    }
    std::vector<at::Tensor> outs;
    for (int i = 0; i < size; ++i) outs.push_back(torch::empty({n}));
    comm::all_gather(outs, in, false, g);
    for (int i = 0; i < size; ++i) {
      EXPECT_EQ(outs[i][0].item<float>(), 1000.0f * ranks[i]) << g.describe();
    }

    // Group rank i receives the sum of slice i.
    auto rs_in = torch::arange(n * size, torch::kFloat) * static_cast<float>(rank + 1);
    auto rs_out = torch::empty({n});
    comm::reduce_scatter(rs_out, rs_in, comm::ReduceOp::kSum, false, g);
    EXPECT_TRUE(torch::equal(
        rs_out, torch::arange(g.rank() * n, (g.rank() + 1) * n, torch::kFloat) * sum_of(ranks, 1.0f)))
        << g.describe();

    // src / dst are global ranks: the last member.
    const int last = ranks.back();
    auto b = rank == last ? torch::full({n}, 42.0f + last) : torch::zeros({n});
    comm::broadcast(b, last, false, g);
    EXPECT_TRUE(torch::equal(b, torch::full({n}, 42.0f + last))) << g.describe();

    auto red = torch::full({n}, static_cast<float>(rank + 1));
    comm::reduce(red, last, comm::ReduceOp::kSum, false, g);
    if (rank == last) EXPECT_TRUE(torch::equal(red, torch::full({n}, sum_of(ranks, 1.0f))));
  }
  auto async_in = torch::ones({3});
  auto h = comm::all_reduce(async_in, comm::ReduceOp::kSum, true, g);
  h.wait();
  EXPECT_EQ(async_in[2].item<float>(), size);
  comm::barrier(g);
}

// Groups of several shapes, created by every rank in the same order: halves, evens and odds,
// the world in reverse order, and a group of one.
void check_new_groups(int rank, int world) {
  std::vector<int> low(world / 2), high(world / 2), evens, odds, reversed(world);
  std::iota(low.begin(), low.end(), 0);
  std::iota(high.begin(), high.end(), world / 2);
  for (int r = 0; r < world; ++r) (r % 2 ? odds : evens).push_back(r);
  for (int r = 0; r < world; ++r) reversed[r] = world - 1 - r;

  std::vector<comm::Group> groups{comm::new_group(low, "low"), comm::new_group(high, "high"),
                                  comm::new_group(evens, "evens"), comm::new_group(odds, "odds"),
                                  comm::new_group(reversed, "reversed"),
                                  comm::new_group({world - 1}, "last")};
  for (const auto& g : groups) {
    const auto it = std::find(g.ranks().begin(), g.ranks().end(), rank);
    EXPECT_EQ(g.is_member(), it != g.ranks().end()) << g.describe();
    EXPECT_EQ(g.rank(), g.is_member() ? static_cast<int>(it - g.ranks().begin()) : -1);
    if (g.is_member()) check_group_collectives(g, rank);
  }
  EXPECT_EQ(groups[4].group_rank(0), world - 1);
  EXPECT_EQ(groups[4].global_rank(0), world - 1);
  EXPECT_EQ(groups[0].describe(), world == 4 ? "low(2) [0, 1]" : "low(4) [0, 1, 2, 3]");

  // Collectives on the world still work between and after sub-group ones.
  auto t = torch::ones({4});
  comm::all_reduce(t);
  EXPECT_EQ(t[0].item<float>(), world);
  EXPECT_EQ(comm::world().size(), world);
  EXPECT_EQ(comm::world().rank(), rank);
}

TEST(GroupsDist, NewGroupCollectivesOnFourRanks) { run_ranks(4, check_new_groups); }

TEST(GroupsDist, NewGroupCollectivesOnEightRanks) { run_ranks(8, check_new_groups); }

TEST(GroupsDist, NonMemberCollectiveIsUsageError) {
  run_ranks(4, [](int rank, int) {
    comm::Group low = comm::new_group({0, 1}, "low");
    auto t = torch::ones({2});
    if (rank >= 2) {
      EXPECT_FALSE(low.is_member());
      try {
        comm::all_reduce(t, comm::ReduceOp::kSum, false, low);
        ADD_FAILURE() << "a non-member's all_reduce on a group was accepted";
      } catch (const UsageError& e) {
        EXPECT_NE(std::string(e.what()).find("all_reduce on group low(2) [0, 1]: rank " +
                                             std::to_string(rank) + " is not a member"),
                  std::string::npos)
            << e.what();
      }
      EXPECT_THROW(comm::barrier(low), UsageError);
    } else {
      // src is a global rank and must be a member.
      EXPECT_THROW(comm::broadcast(t, 3, false, low), UsageError);
      EXPECT_THROW(comm::all_reduce(t, comm::ReduceOp::kSum, false, comm::Group()), UsageError);
    }
    EXPECT_THROW(comm::new_group({0, 0}, "twice"), UsageError);
    EXPECT_THROW(comm::new_group({0, 4}, "outside"), UsageError);
  });
}

TEST(GroupsDist, MembersThatDisagreeFailNamingBothViews) {
  testing::RunOptions o;
  o.comm_timeout_ms = 3000;
  run_ranks(
      4,
      [](int rank, int) {
        // Rank 1 asks for another group than rank 0, its first member, in the same call.
        std::string message;
        try {
          comm::new_group({0, 1}, rank == 1 ? "model" : "data");
        } catch (const CommError& e) {
          message = e.what();
        }
        if (rank == 1) {
          std::ofstream(testing::rank_output_dir() + "/disagree.txt") << message;
        }
        std::this_thread::sleep_for(std::chrono::seconds(4));  // keep the store (rank 0) alive
        std::_Exit(0);
      },
      o);
  std::ifstream in(testing::rank_output_dir() + "/disagree.txt");
  std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("this rank creates model [0, 1] but rank 0 created data [0, 1]"),
            std::string::npos)
      << report;
}

TEST(GroupsDist, TimeoutReportNamesTheGroup) {
  testing::RunOptions o;
  o.comm_timeout_ms = 3000;
  run_ranks(
      4,
      [](int rank, int) {
        comm::Group odds = comm::new_group({1, 3}, "data");
        auto t = torch::ones({16});
        comm::all_reduce(t);  // the world's #1: not counted on the group
        if (rank == 1 || rank == 3) comm::all_reduce(t, comm::ReduceOp::kSum, false, odds);
        if (rank != 1) {
          // Rank 3 skips the group's second collective; rank 0 keeps the store alive.
          std::this_thread::sleep_for(std::chrono::seconds(7));
          std::_Exit(0);
        }
        std::string message;
        try {
          comm::all_reduce(t, comm::ReduceOp::kSum, false, odds);
        } catch (const CommError& e) {
          message = e.what();
        }
        std::ofstream(testing::rank_output_dir() + "/report.txt") << message;
        std::_Exit(0);
      },
      o);
  std::ifstream in(testing::rank_output_dir() + "/report.txt");
  std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(report.find("[rank 1/4] collective #2 all_reduce on group data(2) [1, 3] (16 x float"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("ranks [3] never issued collective #2 (all_reduce on group data(2) [1, 3])"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("rank 3: last issued #1 all_reduce on group data(2) [1, 3]"),
            std::string::npos)
      << report;
}

// The comms logger keeps a sub-group's collectives apart from the world's, under the group's
// name, with the group's size in the bandwidth formulas.
TEST(GroupsDist, CommsLoggerNamesTheGroup) {
  run_ranks(4, [](int rank, int) {
    CommsLoggerConfig config;
    config.enabled = true;
    comm::configure_comms_logger(config);
    comm::Group low = comm::new_group({0, 1}, "low");
    comm::Group high = comm::new_group({2, 3}, "high");
    auto t = torch::ones({256});
    comm::all_reduce(t, comm::ReduceOp::kSum, false, rank < 2 ? low : high);
    comm::all_reduce(t);
    std::vector<std::string> names;
    for (const auto& e : comm::comms_log_entries()) names.push_back(e.record_name);
    const std::string mine = rank < 2 ? "all_reduce (group low)" : "all_reduce (group high)";
    EXPECT_EQ(names, (std::vector<std::string>{mine, "all_reduce"}));
  });
}

// Every rank builds the groups of `topo`, then all ranks all-gather (over the world) each rank's
// view of its group on every axis: each view must be the topology's list holding that rank,
// identical on all its members, with this rank at its coordinate. Then an all-reduce on each
// axis group sums the members' global ranks.
void check_parallel_groups(const ProcessTopology& topo, int rank, int world) {
  comm::ParallelGroups groups(topo);
  for (const auto& axis : topo.get_axis_names()) {
    const comm::Group& g = groups.group(axis);
    EXPECT_EQ(g.name(), axis);
    EXPECT_EQ(g.rank(), topo.get_coord(rank, axis)) << axis;
    EXPECT_EQ(groups.coord(axis), topo.get_coord(rank, axis)) << axis;

    // Each rank's view, padded to the world size with -1.
    auto mine = torch::full({world}, -1, torch::kLong);
    for (int i = 0; i < g.size(); ++i) mine[i] = g.ranks()[static_cast<size_t>(i)];
    auto all = torch::empty({world * world}, torch::kLong);
    comm::all_gather(all, mine);
    for (int r = 0; r < world; ++r) {
      std::vector<int> expected;
      for (const auto& list : topo.get_axis_comm_lists(axis)) {
        if (std::find(list.begin(), list.end(), r) != list.end()) expected = list;
      }
      auto view = all.narrow(0, r * world, world);
      for (int i = 0; i < world; ++i) {
        const int64_t want = i < static_cast<int>(expected.size()) ? expected[static_cast<size_t>(i)] : -1;
        EXPECT_EQ(view[i].item<int64_t>(), want) << "rank " << r << "'s " << axis << " group";
      }
    }

    auto t = torch::full({3}, static_cast<float>(rank));
    comm::all_reduce(t, comm::ReduceOp::kSum, false, g);
    EXPECT_EQ(t[0].item<float>(), sum_of(g.ranks(), 0.0f)) << g.describe();
    auto rs_out = torch::empty({2});
    comm::reduce_scatter(rs_out, torch::ones({2 * g.size()}) * static_cast<float>(rank), comm::ReduceOp::kSum,
                         false, g);
    EXPECT_EQ(rs_out[1].item<float>(), sum_of(g.ranks(), 0.0f)) << g.describe();
  }
  // Axes the topology lacks are groups of this rank alone.
  for (const char* axis : {"data", "model", "pipe", "expert"}) {
    if (topo.has_axis(axis)) continue;
    EXPECT_EQ(groups.group(axis).size(), 1) << axis;
    EXPECT_EQ(groups.group(axis).ranks(), std::vector<int>{rank}) << axis;
  }
  EXPECT_THROW(groups.group("sequence"), UsageError);
}

TEST(GroupsDist, ParallelGroupsAgreeOnFourRanks_Model2Data2) {
  run_ranks(4, [](int rank, int world) {
    check_parallel_groups(PipeModelDataParallelTopology(1, 2, 2), rank, world);
    check_parallel_groups(ProcessTopology({"data", "expert"}, {2, 2}), rank, world);
  });
}

TEST(GroupsDist, ParallelGroupsAgreeOnEightRanks_Pipe2Model2Data2) {
  run_ranks(8, [](int rank, int world) {
    check_parallel_groups(PipeModelDataParallelTopology(2, 2, 2), rank, world);
    check_parallel_groups(PipeDataParallelTopology(2, 4), rank, world);
  });
}

TEST(GroupsDist, TopologyMpuAnswersMegatronsQuestions) {
  run_ranks(8, [](int rank, int) {
    const ProcessTopology topo = PipeModelDataParallelTopology(2, 2, 2);
    TopologyMpu mpu(topo);
    EXPECT_EQ(mpu.get_model_parallel_world_size(), 2);
    EXPECT_EQ(mpu.get_data_parallel_world_size(), 2);
    EXPECT_EQ(mpu.get_pipe_parallel_world_size(), 2);
    EXPECT_EQ(mpu.get_model_parallel_rank(), topo.get_coord(rank, "model"));
    EXPECT_EQ(mpu.get_data_parallel_rank(), topo.get_coord(rank, "data"));
    EXPECT_EQ(mpu.get_pipe_parallel_rank(), topo.get_coord(rank, "pipe"));
    EXPECT_EQ(mpu.get_data_parallel_group().ranks(), topo.get_axis_comm_lists("data")[
        static_cast<size_t>(topo.get_coord(rank, "pipe") * 2 + topo.get_coord(rank, "model"))]);
    EXPECT_EQ(mpu.topology().get_rank_repr(rank), "model_0" + std::to_string(rank % 2));
    EXPECT_THROW(TopologyMpu(PipeModelDataParallelTopology(1, 2, 2)), UsageError);  // 4 != 8
  });
}

}  // namespace
}  // namespace deepspeed

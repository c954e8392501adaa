// ProcessTopology against DeepSpeed's layout (runtime/pipe/topology.py and its unit tests).
#include "deepspeed/topology.h"

#include <gtest/gtest.h>

#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

using Lists = std::vector<std::vector<int>>;

TEST(ProcessTopology, RowMajorOverTheAxesInOrder) {
  ProcessTopology topo({"a", "b"}, {2, 2});
  EXPECT_EQ(topo.world_size(), 4);
  EXPECT_EQ(topo.get_rank({{"a", 0}, {"b", 0}}), 0);
  EXPECT_EQ(topo.get_rank({{"a", 0}, {"b", 1}}), 1);
  EXPECT_EQ(topo.get_rank({{"a", 1}, {"b", 0}}), 2);
  EXPECT_EQ(topo.get_rank({{"a", 1}, {"b", 1}}), 3);
  EXPECT_EQ(topo.get_axis_comm_lists("a"), (Lists{{0, 2}, {1, 3}}));
  EXPECT_EQ(topo.get_axis_comm_lists("b"), (Lists{{0, 1}, {2, 3}}));
  EXPECT_EQ(topo.get_axis_comm_lists("c"), Lists{});
  EXPECT_EQ(topo.get_dim("c"), 1);
}

TEST(ProcessTopology, CoordinatesRoundTripOnEveryRank) {
  ProcessTopology topo({"pipe", "data", "model", "expert"}, {2, 3, 2, 2});
  ASSERT_EQ(topo.world_size(), 24);
  for (int rank = 0; rank < topo.world_size(); ++rank) {
    EXPECT_EQ(topo.get_rank(topo.get_coord(rank)), rank);
  }
}

TEST(ProcessTopology, PipeModelDataMatchesDeepSpeed) {
  auto topo = PipeModelDataParallelTopology(/*num_pp=*/2, /*num_mp=*/2, /*num_dp=*/2);
  EXPECT_EQ(topo.get_axis_names(), (std::vector<std::string>{"pipe", "data", "model"}));
  EXPECT_EQ(topo.get_axis_comm_lists("model"), (Lists{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(topo.get_axis_comm_lists("data"), (Lists{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(topo.get_axis_comm_lists("pipe"), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(topo.get_coord(5), (std::map<std::string, int>{{"pipe", 1}, {"data", 0}, {"model", 1}}));
  // Checkpoint names: mp_rank_XX comes from "model_XX".
  EXPECT_EQ(topo.get_rank_repr(3), "model_01");
  EXPECT_EQ(topo.get_rank_repr(6, {}), "pipe_01-data_01-model_00");
  EXPECT_EQ(topo.get_rank_repr(6, {"model"}, "=", "+"), "pipe=01+data=01");
  EXPECT_EQ(topo.filter_match({{"pipe", 0}, {"model", 1}}), (std::vector<int>{1, 3}));
  EXPECT_EQ(topo.get_axis_list("pipe", 1), (std::vector<int>{4, 5, 6, 7}));
}

TEST(ProcessTopology, PipeDataMatchesDeepSpeed) {
  auto topo = PipeDataParallelTopology(/*num_pp=*/2, /*num_dp=*/4);
  EXPECT_EQ(topo.get_axis_comm_lists("data"), (Lists{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(topo.get_axis_comm_lists("pipe"), (Lists{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(topo.get_rank_repr(5), "");
}

TEST(ProcessTopology, BadInputIsAClearError) {
  EXPECT_THROW(ProcessTopology({"a", "a"}, {2, 2}), UsageError);
  EXPECT_THROW(ProcessTopology({"a"}, {0}), UsageError);
  EXPECT_THROW(ProcessTopology({"a", "b"}, {2}), UsageError);
  ProcessTopology topo({"a", "b"}, {2, 2});
  EXPECT_THROW(topo.get_rank({{"a", 2}, {"b", 0}}), UsageError);
  EXPECT_THROW(topo.get_rank({{"a", 0}}), UsageError);
  EXPECT_THROW(topo.get_coord(4), UsageError);
  EXPECT_THROW(topo.filter_match({{"z", 0}}), UsageError);
}

}  // namespace
}  // namespace deepspeed

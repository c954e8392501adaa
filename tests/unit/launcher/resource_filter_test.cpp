// Tests for --include/--exclude/--num_nodes/--num_gpus (tools/deepspeed/resource_filter.cpp): the
// resulting rank layout for a table of cases, and every error by its message.
#include "resource_filter.h"

#include <gtest/gtest.h>

#include "expect_usage.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;

// worker-0 slots=4, worker-1 slots=2, worker-2 slots=2 (lines 1-3).
ResourcePool pool() { return {{"worker-0", 4, 1}, {"worker-1", 2, 2}, {"worker-2", 2, 3}}; }

struct Selection {
  const char* name;
  ResourceRequest request;
  const char* expected;  // describe_world() of the result
  int ranks;
};

class SelectResources : public ::testing::TestWithParam<Selection> {};

TEST_P(SelectResources, GivesTheRankLayout) {
  WorldInfo world = select_resources(pool(), GetParam().request);
  EXPECT_EQ(describe_world(world), GetParam().expected);
  EXPECT_EQ(world_size(world), GetParam().ranks);
}

INSTANTIATE_TEST_SUITE_P(
    Table, SelectResources,
    ::testing::Values(
        Selection{"Everything", {}, "worker-0:0,1,2,3@worker-1:0,1@worker-2:0,1", 8},
        Selection{"IncludeWholeHost", {"worker-1", "", -1, -1}, "worker-1:0,1", 2},
        Selection{"IncludeSlots", {"worker-0:0,2", "", -1, -1}, "worker-0:0,2", 2},
        Selection{"IncludeKeepsHostfileOrder", {"worker-2@worker-0:1", "", -1, -1}, "worker-0:1@worker-2:0,1", 3},
        Selection{"IncludeMergesAndSortsSlots", {"worker-0:3,1@worker-0:1,0", "", -1, -1}, "worker-0:0,1,3", 3},
        Selection{"IncludeWholeHostWinsOverSlots", {"worker-1:1@worker-1", "", -1, -1}, "worker-1:0,1", 2},
        Selection{"ExcludeHost", {"", "worker-1", -1, -1}, "worker-0:0,1,2,3@worker-2:0,1", 6},
        Selection{"ExcludeSlots", {"", "worker-0:0,3@worker-2:1", -1, -1}, "worker-0:1,2@worker-1:0,1@worker-2:0", 5},
        Selection{"ExcludeEmptiesAHost", {"", "worker-1:0,1", -1, -1}, "worker-0:0,1,2,3@worker-2:0,1", 6},
        Selection{"NumNodes", {"", "", 2, -1}, "worker-0:0,1,2,3@worker-1:0,1", 6},
        Selection{"NumGpus", {"", "", -1, 1}, "worker-0:0@worker-1:0@worker-2:0", 3},
        Selection{"NumGpusAboveSlots", {"", "", -1, 3}, "worker-0:0,1,2@worker-1:0,1,2@worker-2:0,1,2", 9},
        Selection{"NumNodesAndGpus", {"", "", 1, 2}, "worker-0:0,1", 2}),
    [](const auto& info) { return info.param.name; });

struct BadSelection {
  const char* name;
  ResourceRequest request;
  std::vector<std::string> fragments;
};

class SelectResourcesRejects : public ::testing::TestWithParam<BadSelection> {};

TEST_P(SelectResourcesRejects, NamingTheToken) {
  expect_usage_error([&] { select_resources(pool(), GetParam().request); }, GetParam().fragments);
}

INSTANTIATE_TEST_SUITE_P(
    EveryError, SelectResourcesRejects,
    ::testing::Values(
        BadSelection{"UnknownHost", {"worker-0@worker-9:0", "", -1, -1},
                     {"--include 'worker-0@worker-9:0'", "host 'worker-9' is not in the hostfile",
                      "worker-0, worker-1, worker-2"}},
        BadSelection{"UnknownHostInExclude", {"", "gpu-box", -1, -1}, {"--exclude 'gpu-box'", "host 'gpu-box'"}},
        BadSelection{"SlotNotOnHost", {"worker-1:2", "", -1, -1},
                     {"host 'worker-1' has no slot 2", "slots 0-1 (line 2)"}},
        BadSelection{"ExcludeEverything", {"", "worker-0@worker-1@worker-2", -1, -1},
                     {"--exclude 'worker-0@worker-1@worker-2' excludes every slot"}},
        BadSelection{"ExcludeEverySlot", {"", "worker-0:0,1,2,3@worker-1@worker-2:0,1", -1, -1}, {"excludes every slot"}},
        BadSelection{"IncludeAndExclude", {"worker-0", "worker-1", -1, -1}, {"mutually exclusive"}},
        BadSelection{"NumNodesWithInclude", {"worker-0", "", 1, -1}, {"--num_nodes cannot be combined with --include"}},
        BadSelection{"NumGpusWithExclude", {"", "worker-0", -1, 2}, {"--num_gpus cannot be combined with --exclude"}},
        BadSelection{"EmptySpec", {"worker-0@@worker-1", "", -1, -1}, {"'worker-0@@worker-1'", "empty host spec"}},
        BadSelection{"TrailingAt", {"worker-0@", "", -1, -1}, {"empty host spec"}},
        BadSelection{"NoHostName", {":0", "", -1, -1}, {"':0' has no host name"}},
        BadSelection{"TwoColons", {"worker-0:0:1", "", -1, -1}, {"'worker-0:0:1' has more than one ':'"}},
        BadSelection{"EmptySlotList", {"worker-0:", "", -1, -1}, {"slot '' in 'worker-0:'"}},
        BadSelection{"NotASlot", {"worker-0:zero", "", -1, -1}, {"slot 'zero' in 'worker-0:zero' is not a non-negative"}},
        BadSelection{"NegativeSlot", {"", "worker-0:-1", -1, -1}, {"slot '-1'"}},
        BadSelection{"TooManyNodes", {"", "", 4, -1}, {"--num_nodes 4 but the hostfile lists only 3 host(s)"}},
        BadSelection{"ZeroNodes", {"", "", 0, -1}, {"--num_nodes 0"}},
        BadSelection{"ZeroGpus", {"", "", -1, 0}, {"--num_gpus 0"}}),
    [](const auto& info) { return info.param.name; });

TEST(ParseNodeSpecs, MergesRepeatsAndKeepsFirstSeenOrder) {
  std::vector<NodeSpec> specs = parse_node_specs("b:1@a@b:0,1", "--include");
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].host, "b");
  EXPECT_EQ(specs[0].slots, (std::vector<int>{0, 1}));
  EXPECT_EQ(specs[1].host, "a");
  EXPECT_TRUE(specs[1].slots.empty());
}

}  // namespace
}  // namespace deepspeed::launcher

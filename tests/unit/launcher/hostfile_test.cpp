// Tests for the hostfile parser (tools/deepspeed/hostfile.cpp): DeepSpeed's format, and an error
// naming the file, line and problem for each malformed case.
#include "hostfile.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "expect_usage.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;

TEST(Hostfile, ParsesHostsInOrderSkippingCommentsAndBlanks) {
  ResourcePool pool = parse_hostfile(
      "# cluster A\n\nworker-1 slots=4\n  worker-0\tslots=2   \n\t# indented comment\n10.0.0.7 slots=1 max_slots=2\n",
      "hosts");
  ASSERT_EQ(pool.size(), 3u);
  EXPECT_EQ(pool[0].host, "worker-1");
  EXPECT_EQ(pool[0].slots, 4);
  EXPECT_EQ(pool[0].line, 3);
  EXPECT_EQ(pool[1].host, "worker-0") << "file order, not sorted: it defines the ranks";
  EXPECT_EQ(pool[1].slots, 2);
  EXPECT_EQ(pool[2].host, "10.0.0.7");
  EXPECT_EQ(pool[2].slots, 1) << "trailing words are ignored, as DeepSpeed's regex does";
  EXPECT_EQ(total_slots(pool), 7);
}

struct BadHostfile {
  const char* name;
  const char* text;
  std::vector<std::string> fragments;
};

class HostfileRejects : public ::testing::TestWithParam<BadHostfile> {};

TEST_P(HostfileRejects, NamingLineAndProblem) {
  expect_usage_error([&] { parse_hostfile(GetParam().text, "/job/hosts"); }, GetParam().fragments);
}

INSTANTIATE_TEST_SUITE_P(
    EveryMalformedCase, HostfileRejects,
    ::testing::Values(
        BadHostfile{"NoSlots", "a slots=1\nworker-2\n", {"/job/hosts line 2 'worker-2'", "expected '<host> slots=<count>'"}},
        BadHostfile{"SlotsMisspelt", "a slot=2\n", {"line 1 'a slot=2'", "expected '<host> slots=<count>'"}},
        BadHostfile{"ZeroSlots", "a slots=0\n", {"line 1", "slots must be a positive integer, got '0'"}},
        BadHostfile{"NegativeSlots", "a slots=-1\n", {"line 1", "got '-1'"}},
        BadHostfile{"NotANumber", "a slots=four\n", {"got 'four'"}},
        BadHostfile{"TrailingJunk", "a slots=4x\n", {"got '4x'"}},
        BadHostfile{"Huge", "a slots=99999999999\n", {"got '99999999999'"}},
        BadHostfile{"DuplicateHost", "a slots=1\nb slots=1\n\na slots=2\n",
                    {"line 4 'a slots=2'", "host 'a' is listed twice (also on line 1)"}},
        BadHostfile{"Empty", "", {"/job/hosts lists no hosts"}},
        BadHostfile{"OnlyComments", "# nothing\n\n", {"lists no hosts"}}),
    [](const auto& info) { return info.param.name; });

TEST(Hostfile, MissingFileIsNullopt_ExistingFileIsRead) {
  EXPECT_FALSE(read_hostfile("/nonexistent/dir/hostfile").has_value());
  const std::string path = ::testing::TempDir() + "/ds_hostfile_test";
  std::ofstream(path) << "localhost slots=3\n";
  auto pool = read_hostfile(path);
  ASSERT_TRUE(pool.has_value());
  EXPECT_EQ((*pool)[0].slots, 3);
  std::ofstream(path) << "localhost slots=x\n";
  expect_usage_error([&] { read_hostfile(path); }, {path + " line 1"});
  std::remove(path.c_str());
  expect_usage_error([&] { read_hostfile("/tmp"); }, {"is a directory"});
}

}  // namespace
}  // namespace deepspeed::launcher

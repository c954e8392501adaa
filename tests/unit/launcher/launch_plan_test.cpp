// Tests for make_launch_plan() (tools/deepspeed/launch_plan.cpp): rank count, per-rank env and
// argv, CUDA_VISIBLE_DEVICES handling and core binding, on machines described by HostInfo.
#include "launch_plan.h"

#include <gtest/gtest.h>

#include <map>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

using Env = std::map<std::string, std::string>;

Env env_of(const RankLaunch& rank) {
  Env env;
  for (const auto& [k, v] : rank.env) env[k] = v;
  return env;
}

LauncherOptions options_for(int num_gpus, std::vector<std::string> args = {}) {
  LauncherOptions o;
  o.num_gpus = num_gpus;
  o.program = "./train_gpt";
  o.program_args = std::move(args);
  return o;
}

HostInfo cpu_host(int cores = 8) {
  HostInfo host;
  for (int i = 0; i < cores; ++i) host.available_cores.push_back(i);
  return host;
}

HostInfo gpu_host(int gpus, std::optional<std::string> visible = std::nullopt) {
  HostInfo host = cpu_host();
  host.gpu_count = gpus;
  host.cuda_visible_devices = std::move(visible);
  return host;
}

void expect_usage_error(const LauncherOptions& o, const HostInfo& host, const std::string& fragment) {
  try {
    make_launch_plan(o, host);
    ADD_FAILURE() << "expected UsageError containing '" << fragment << "'";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(LaunchPlan, EachRank_GetsDeepSpeedLauncherEnv) {
  LauncherOptions o = options_for(3);
  o.master_port = 29611;
  LaunchPlan plan = make_launch_plan(o, cpu_host());
  ASSERT_EQ(plan.ranks.size(), 3u);
  EXPECT_EQ(plan.world_size, 3);
  for (int r = 0; r < 3; ++r) {
    Env env = env_of(plan.ranks[r]);
    EXPECT_EQ(plan.ranks[r].rank, r);
    EXPECT_EQ(plan.ranks[r].local_rank, r);
    EXPECT_EQ(env["RANK"], std::to_string(r));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(r));
    EXPECT_EQ(env["WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_SIZE"], "3");
    EXPECT_EQ(env["CROSS_RANK"], "0");
    EXPECT_EQ(env["CROSS_SIZE"], "1");
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29611");
    EXPECT_EQ(env["PYTHONUNBUFFERED"], "1");
    EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << "CPU-only: leave it alone";
    EXPECT_EQ(env.count("OMP_NUM_THREADS"), 0u) << "only --bind_cores_to_rank sets it";
    EXPECT_TRUE(plan.ranks[r].cpu_cores.empty());
  }
  EXPECT_TRUE(plan.warnings.empty());
}

TEST(LaunchPlan, LocalRankFlag_IsAppendedAfterProgramArgs) {
  LaunchPlan plan = make_launch_plan(options_for(2, {"--num_gpus", "7", "--foo"}), cpu_host());
  EXPECT_EQ(plan.ranks[1].argv, (std::vector<std::string>{"./train_gpt", "--num_gpus", "7", "--foo", "--local_rank=1"}));
  LauncherOptions o = options_for(2, {"--foo"});
  o.no_local_rank = true;
  EXPECT_EQ(make_launch_plan(o, cpu_host()).ranks[1].argv, (std::vector<std::string>{"./train_gpt", "--foo"}));
}

TEST(LaunchPlan, RankCount_DefaultsFromMachine) {
  EXPECT_EQ(make_launch_plan(options_for(-1), cpu_host()).world_size, 1) << "CPU-only: 1 process";
  EXPECT_EQ(make_launch_plan(options_for(-1), gpu_host(4)).world_size, 4) << "every GPU, as DeepSpeed";
  EXPECT_EQ(make_launch_plan(options_for(-1), gpu_host(8, "2, 5,7")).world_size, 3) << "CUDA_VISIBLE_DEVICES entries";
  HostInfo cpu_with_list = cpu_host();
  cpu_with_list.cuda_visible_devices = "0,1";
  EXPECT_EQ(make_launch_plan(options_for(-1), cpu_with_list).world_size, 2);
  EXPECT_EQ(make_launch_plan(options_for(5), cpu_host()).world_size, 5) << "--num_gpus counts processes";
}

TEST(LaunchPlan, Gpus_GetDevicesZeroToNMinusOne) {
  LaunchPlan plan = make_launch_plan(options_for(2), gpu_host(4));
  EXPECT_EQ(env_of(plan.ranks[0])["CUDA_VISIBLE_DEVICES"], "0,1");
  EXPECT_EQ(env_of(plan.ranks[1])["CUDA_VISIBLE_DEVICES"], "0,1");
  EXPECT_TRUE(plan.warnings.empty());
}

TEST(LaunchPlan, ExistingVisibleDevices_FirstNAreHonoured) {
  LaunchPlan plan = make_launch_plan(options_for(2), gpu_host(8, "3,5,7"));
  EXPECT_EQ(env_of(plan.ranks[1])["CUDA_VISIBLE_DEVICES"], "3,5");
  EXPECT_EQ(plan.cuda_visible_devices, (std::vector<std::string>{"3", "5"}));
  LaunchPlan all = make_launch_plan(options_for(-1), gpu_host(8, "GPU-abc,GPU-def"));
  EXPECT_EQ(env_of(all.ranks[0])["CUDA_VISIBLE_DEVICES"], "GPU-abc,GPU-def");
}

TEST(LaunchPlan, MoreRanksThanVisibleDevices_IsRejected) {
  expect_usage_error(options_for(4), gpu_host(8, "3,5"), "CUDA_VISIBLE_DEVICES=3,5 lists 2 device(s)");
}

TEST(LaunchPlan, MoreRanksThanGpus_Warns) {
  LaunchPlan plan = make_launch_plan(options_for(3), gpu_host(2));
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("only 2 GPU(s)"), std::string::npos) << plan.warnings[0];
}

TEST(LaunchPlan, CpuOnly_LeavesExistingVisibleDevicesAlone) {
  HostInfo host = cpu_host();
  host.cuda_visible_devices = "-1";
  LaunchPlan plan = make_launch_plan(options_for(2), host);
  EXPECT_EQ(env_of(plan.ranks[0]).count("CUDA_VISIBLE_DEVICES"), 0u);
}

TEST(LaunchPlan, BadFlags_AreRejectedByName) {
  expect_usage_error(options_for(0), cpu_host(), "--num_gpus 0");
  expect_usage_error(options_for(-3), cpu_host(), "--num_gpus -3");
  LauncherOptions port = options_for(1);
  port.master_port = 70000;
  expect_usage_error(port, cpu_host(), "--master_port 70000");
}

TEST(LaunchPlan, EmptyMasterAddr_MeansLoopbackOnOneMachine) {
  LauncherOptions o = options_for(1);
  o.master_addr = "";
  EXPECT_EQ(env_of(make_launch_plan(o, cpu_host()).ranks[0])["MASTER_ADDR"], "127.0.0.1");
  o.master_addr = "10.1.2.3";
  EXPECT_EQ(env_of(make_launch_plan(o, cpu_host()).ranks[0])["MASTER_ADDR"], "10.1.2.3");
}

TEST(LaunchPlan, BindCoresToRank_SplitsEvenlyAndSetsOmpThreads) {
  LauncherOptions o = options_for(3);
  o.bind_cores_to_rank = true;
  LaunchPlan plan = make_launch_plan(o, cpu_host(8));  // 8 / 3 = 2 each, cores 6-7 unused
  EXPECT_EQ(plan.ranks[0].cpu_cores, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.ranks[2].cpu_cores, (std::vector<int>{4, 5}));
  EXPECT_EQ(env_of(plan.ranks[2])["OMP_NUM_THREADS"], "2");
  EXPECT_NE(plan.summary().find("rank 2=4-5"), std::string::npos) << plan.summary();
}

TEST(LaunchPlan, BindCoreList_IsSplitInTheGivenOrder) {
  LauncherOptions o = options_for(2);
  o.bind_cores_to_rank = true;
  o.bind_core_list = "1,3-5,7";
  LaunchPlan plan = make_launch_plan(o, cpu_host(8));
  EXPECT_EQ(plan.ranks[0].cpu_cores, (std::vector<int>{1, 3}));
  EXPECT_EQ(plan.ranks[1].cpu_cores, (std::vector<int>{4, 5}));
  EXPECT_EQ(env_of(plan.ranks[1])["OMP_NUM_THREADS"], "2");
}

TEST(LaunchPlan, BindCores_RejectsTooFewOrForeignCores) {
  LauncherOptions o = options_for(4);
  o.bind_cores_to_rank = true;
  expect_usage_error(o, cpu_host(2), "cannot give each of 4 rank(s) a core");
  LauncherOptions foreign = options_for(1);
  foreign.bind_cores_to_rank = true;
  foreign.bind_core_list = "0,9";
  expect_usage_error(foreign, cpu_host(4), "core 9 is not available to this process (allowed: 0-3)");
}

TEST(LaunchPlan, BindCoreListAlone_WarnsItDoesNothing) {
  LauncherOptions o = options_for(2);
  o.bind_core_list = "0-1";
  LaunchPlan plan = make_launch_plan(o, cpu_host());
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("--bind_cores_to_rank"), std::string::npos);
  EXPECT_TRUE(plan.ranks[0].cpu_cores.empty());
}

// Two hosts with 2 and 3 slots: the second host's plan (DeepSpeed's launch.py on node 1).
WorldInfo two_hosts() { return {{"worker-0", {0, 1}}, {"worker-1", {0, 2, 3}}}; }

TEST(NodePlan, SecondHost_GetsRanksAfterTheFirstHostsSlots) {
  LauncherOptions o = options_for(-1, {"--x"});
  o.master_addr = "10.0.0.1";
  o.master_port = 29700;
  LaunchPlan plan = make_node_plan(o, two_hosts(), 1, cpu_host());
  ASSERT_EQ(plan.ranks.size(), 3u);
  EXPECT_EQ(plan.world_size, 5);
  for (int local = 0; local < 3; ++local) {
    Env env = env_of(plan.ranks[local]);
    EXPECT_EQ(plan.ranks[local].rank, 2 + local);
    EXPECT_EQ(env["RANK"], std::to_string(2 + local));
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(env["WORLD_SIZE"], "5");
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(env["LOCAL_SIZE"], "3");
    EXPECT_EQ(env["CROSS_RANK"], "1");
    EXPECT_EQ(env["CROSS_SIZE"], "2");
    EXPECT_EQ(env["MASTER_ADDR"], "10.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], "29700");
    EXPECT_EQ(env.count("CUDA_VISIBLE_DEVICES"), 0u) << "CPU-only host";
    EXPECT_EQ(plan.ranks[local].argv.back(), "--local_rank=" + std::to_string(local));
  }
  EXPECT_NE(plan.summary().find("host 1 of 2: launching rank(s) 2-4 of 5"), std::string::npos) << plan.summary();
}

TEST(NodePlan, GpuHost_SeesItsSlotsAsVisibleDevices) {
  LauncherOptions o = options_for(-1);
  o.master_addr = "10.0.0.1";
  LaunchPlan plan = make_node_plan(o, two_hosts(), 1, gpu_host(4));
  EXPECT_EQ(env_of(plan.ranks[2])["CUDA_VISIBLE_DEVICES"], "0,2,3");
  EXPECT_TRUE(plan.warnings.empty());
  LaunchPlan short_of_gpus = make_node_plan(o, two_hosts(), 1, gpu_host(3));
  ASSERT_EQ(short_of_gpus.warnings.size(), 1u);
  EXPECT_NE(short_of_gpus.warnings[0].find("slot 3 but only 3 GPU(s)"), std::string::npos);
}

TEST(NodePlan, BindCores_SplitsThisHostsCoresOverItsRanks) {
  LauncherOptions o = options_for(-1);
  o.master_addr = "10.0.0.1";
  o.bind_cores_to_rank = true;
  LaunchPlan plan = make_node_plan(o, two_hosts(), 0, cpu_host(8));
  EXPECT_EQ(plan.ranks[1].cpu_cores, (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(env_of(plan.ranks[1])["OMP_NUM_THREADS"], "4");
}

TEST(NodePlan, BadNodeRankOrMissingMaster_AreRejected) {
  LauncherOptions o = options_for(-1);
  o.master_addr = "10.0.0.1";
  for (int bad : {-1, 2}) {
    try {
      make_node_plan(o, two_hosts(), bad, cpu_host());
      ADD_FAILURE() << "node_rank " << bad;
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("--node_rank " + std::to_string(bad) + ": expected 0..1"), std::string::npos)
          << e.what();
    }
  }
  o.master_addr = "";
  try {
    make_node_plan(o, two_hosts(), 0, cpu_host());
    ADD_FAILURE();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--master_addr is required"), std::string::npos) << e.what();
  }
}

TEST(LaunchPlan, SplitDeviceList_TrimsAndDropsEmpties) {
  EXPECT_EQ(split_device_list(" 0, 1,,2 "), (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_TRUE(split_device_list("").empty());
}

}  // namespace
}  // namespace deepspeed::launcher

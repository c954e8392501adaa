// OptimizerSwapper (src/runtime/swap): sub-groups of named tensors go to files in DeepSpeed's
// folder layout and come back intact through few buffers; read-ahead and write-behind happen
// when asked for; small sub-groups stay in memory; missing, truncated and unwritable swap files
// are errors that name the file.
#include "runtime/swap/optimizer_swapper.h"

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::runtime::swap {
namespace {

using testing::TempDir;

SwapperOptions small_options(const std::string& dir, bool pipeline) {
  SwapperOptions o;
  o.nvme_path = dir;
  o.rank = 3;
  o.buffer_count = 3;
  o.pipeline_read = pipeline;
  o.pipeline_write = pipeline;
  o.aio.block_size = 4096;
  o.min_swap_bytes = 0;  // swap even these small test tensors
  return o;
}

// Sub-group k: an fp32 "master" of awkward size and two state tensors, one of them 2-D bf16.
std::vector<NamedTensor> make_group(int k) {
  const int64_t n = 1000 + 777 * k;
  return {{"fp32", torch::randn({n})},
          {"exp_avg", torch::randn({n})},
          {"exp_avg_sq", torch::rand({3, 5 + k}).to(torch::kBFloat16)}};
}

TEST(OptimizerSwapper, StatesSurviveStepsThroughFewerBuffersThanSubGroups) {
  for (bool pipeline : {false, true}) {
    SCOPED_TRACE(pipeline ? "pipelined" : "synchronous");
    TempDir dir("ds_swap");
    OptimizerSwapper swapper(small_options(dir.path(), pipeline));
    constexpr int kGroups = 5;
    std::vector<std::vector<NamedTensor>> handles;
    std::vector<std::vector<at::Tensor>> expected;
    for (int k = 0; k < kGroups; ++k) {
      handles.push_back(make_group(k));
      expected.emplace_back();
      for (auto& t : handles.back()) expected.back().push_back(t.tensor.clone());
      EXPECT_EQ(swapper.add_sub_group(handles.back()), k);
      // Released at once: the state lives in its files only.
      for (auto& t : handles.back()) EXPECT_EQ(t.tensor.numel(), 0);
      EXPECT_FALSE(swapper.in_memory(k));
    }
    EXPECT_EQ(swapper.swap_folder(), dir.path() + "/zero_stage_3/optimizer/rank3");
    EXPECT_TRUE(std::filesystem::exists(swapper.swap_path(4, "exp_avg_sq")));
    EXPECT_EQ(swapper.swap_path(4, "exp_avg_sq"),
              swapper.swap_folder() + "/4_exp_avg_sq.tensor.swp");

    for (int pass = 0; pass < 3; ++pass) {
      swapper.step_sub_groups([&](int k) {
        auto& hs = handles[static_cast<size_t>(k)];
        auto& want = expected[static_cast<size_t>(k)];
        for (size_t i = 0; i < hs.size(); ++i) {
          ASSERT_TRUE(torch::equal(hs[i].tensor, want[i])) << "sub-group " << k << " " << hs[i].name;
          hs[i].tensor.add_(1.0);  // a "step" in place, as an optimizer does
          want[i].add_(1.0);
        }
      });
    }
    swapper.synchronize();
    for (int k = 0; k < kGroups; ++k) EXPECT_FALSE(swapper.in_memory(k));
    EXPECT_EQ(swapper.reads(), 3 * kGroups * 3);
    EXPECT_EQ(swapper.writes(), 3 * kGroups * 3 + kGroups * 3);  // + the first write
    EXPECT_EQ(swapper.buffer_bytes() > 0, true);
    EXPECT_LE(swapper.buffer_bytes(), 3 * (4 * 4096 + 2 * 4 * 4096 + 4096));
  }
}

TEST(OptimizerSwapper, ReadAheadAndWriteBehindOverlapTheStep) {
  for (bool pipeline : {false, true}) {
    TempDir dir("ds_swap");
    OptimizerSwapper swapper(small_options(dir.path(), pipeline));
    std::vector<std::vector<NamedTensor>> handles;
    for (int k = 0; k < 4; ++k) {
      handles.push_back(make_group(k));
      swapper.add_sub_group(handles.back());
    }
    const int64_t writes0 = swapper.writes();
    std::vector<int64_t> reads_during, writes_during, writes_in_flight;
    swapper.step_sub_groups([&](int k) {
      reads_during.push_back(swapper.reads());
      writes_during.push_back(swapper.writes() - writes0);
      writes_in_flight.push_back(swapper.writes_in_flight());
    });
    for (int k = 0; k < 4; ++k) {
      const size_t i = static_cast<size_t>(k);
      // Read-ahead: while k steps, k+1 is already being read (3 tensors each).
      const int64_t ahead = pipeline && k < 3 ? 1 : 0;
      EXPECT_EQ(reads_during[i], 3 * (k + 1 + ahead)) << k;
      EXPECT_EQ(writes_during[i], 3 * k) << k;
    }
    // Write-behind: sub-group 0's write runs while 1 steps (3 buffers: 1 in memory, 2 being
    // read, 0 being written). Without pipeline_write every swap_out waits for its write.
    EXPECT_EQ(writes_in_flight[1], pipeline ? 3 : 0);
    if (!pipeline) {
      for (int64_t w : writes_in_flight) EXPECT_EQ(w, 0);
    }
    swapper.synchronize();
    EXPECT_EQ(swapper.writes_in_flight(), 0);
  }
}

TEST(OptimizerSwapper, WriteBehindLeavesTheLastWriteInFlightUntilNeeded) {
  TempDir dir("ds_swap");
  OptimizerSwapper swapper(small_options(dir.path(), /*pipeline=*/true));
  auto g = make_group(0);
  const at::Tensor want = g[0].tensor.clone();
  swapper.add_sub_group(g);
  swapper.swap_in(0);
  g[0].tensor.mul_(2);
  swapper.swap_out(0);
  EXPECT_EQ(g[0].tensor.numel(), 0);  // released at once, the write still running
  swapper.swap_in(0);                 // waits for that write, then reads it back
  EXPECT_TRUE(torch::equal(g[0].tensor, want * 2));
}

TEST(OptimizerSwapper, SmallSubGroupsStayInMemoryAsInDeepSpeed) {
  TempDir dir("ds_swap");
  SwapperOptions o = small_options(dir.path(), true);
  o.min_swap_bytes = -1;  // DeepSpeed's max(1 MiB, block_size)
  OptimizerSwapper swapper(o);
  auto small = make_group(0);
  std::vector<NamedTensor> large = {{"fp32", torch::randn({300000})}};  // 1.2 MB
  const at::Tensor small_data = small[0].tensor;
  EXPECT_EQ(swapper.add_sub_group(small), 0);
  EXPECT_EQ(swapper.add_sub_group(large), 1);
  EXPECT_FALSE(swapper.swappable(0));
  EXPECT_TRUE(swapper.swappable(1));
  EXPECT_TRUE(small[0].tensor.is_same(small_data));
  EXPECT_EQ(large[0].tensor.numel(), 0);
  EXPECT_FALSE(std::filesystem::exists(swapper.swap_path(0, "fp32")));
  EXPECT_GT(swapper.resident_bytes(), 0);
  EXPECT_EQ(swapper.swapped_bytes(), 1200128);  // 300000 * 4 rounded up to 4 KiB
}

TEST(OptimizerSwapper, AMissingSwapFileIsNamed) {
  TempDir dir("ds_swap");
  OptimizerSwapper swapper(small_options(dir.path(), false));
  auto g = make_group(1);
  swapper.add_sub_group(g);
  const std::string file = swapper.swap_path(0, "exp_avg");
  std::filesystem::remove(file);
  EXPECT_THROW_WITH(swapper.swap_in(0), aio::AioError, file);
  EXPECT_THROW_WITH(swapper.swap_in(0), aio::AioError, "sub-group 0");
}

TEST(OptimizerSwapper, ATruncatedSwapFileIsNamed) {
  TempDir dir("ds_swap");
  OptimizerSwapper swapper(small_options(dir.path(), true));
  auto g = make_group(1);
  swapper.add_sub_group(g);
  const std::string file = swapper.swap_path(0, "fp32");
  ASSERT_EQ(::truncate(file.c_str(), 100), 0);
  EXPECT_THROW_WITH(swapper.swap_in(0), aio::AioError, file + " holds 100 bytes");
}

TEST(OptimizerSwapper, AnUnwritableSwapFileIsNamed) {
  TempDir dir("ds_swap");
  OptimizerSwapper swapper(small_options(dir.path(), false));
  auto g = make_group(0);
  swapper.add_sub_group(g);
  swapper.swap_in(0);
  // A directory where the file should be: no user, root included, can open it for writing.
  const std::string file = swapper.swap_path(0, "exp_avg_sq");
  std::filesystem::remove(file);
  std::filesystem::create_directory(file);
  EXPECT_THROW_WITH(swapper.swap_out(0), aio::AioError, file);
  EXPECT_THROW_WITH(swapper.swap_out(0), aio::AioError, "Is a directory");
}

TEST(OptimizerSwapper, AnUncreatableFolderIsNamed) {
  TempDir dir("ds_swap");
  testing::write_text_file(dir.file("plain"), "x");
  SwapperOptions o = small_options(dir.file("plain"), false);
  EXPECT_THROW_WITH(OptimizerSwapper{o}, aio::AioError,
                    "cannot create the optimizer swap folder " + dir.file("plain"));
  o = small_options(dir.path(), false);
  o.buffer_count = 0;
  EXPECT_THROW_WITH(OptimizerSwapper{o}, ConfigError, "offload_optimizer.buffer_count is 0");
}

TEST(OptimizerSwapper, RemovesItsFilesWhenDestroyed) {
  TempDir dir("ds_swap");
  std::string file;
  {
    OptimizerSwapper swapper(small_options(dir.path(), true));
    auto g = make_group(0);
    swapper.add_sub_group(g);
    file = swapper.swap_path(0, "fp32");
    EXPECT_TRUE(std::filesystem::exists(file));
  }
  EXPECT_FALSE(std::filesystem::exists(file));
}

}  // namespace
}  // namespace deepspeed::runtime::swap

// ShardSwapper (src/runtime/swap/shard_swapper.h): parameter shards go to files in DeepSpeed's
// folder layout and come back intact through few buffers (packed several to a buffer), read
// ahead when asked; max_in_cpu
// keeps the first ones in memory; updated shards are written through; undersized buffers are
// errors naming the key, missing or truncated files errors naming the file.
#include "runtime/swap/shard_swapper.h"

#include <filesystem>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::runtime::swap {
namespace {

using testing::TempDir;

ShardSwapperOptions options(const std::string& dir, at::ScalarType dtype) {
  ShardSwapperOptions o;
  o.nvme_path = dir;
  o.rank = 1;
  o.dtype = dtype;
  o.buffer_count = 2;
  o.buffer_size = 5000;
  o.max_in_cpu = 0;
  o.aio.block_size = 4096;
  return o;
}

TEST(ShardSwapper, ShardsRoundTripThroughTwoBuffers) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    TempDir dir("ds_shards");
    ShardSwapper swapper(options(dir.path(), dtype));
    std::vector<at::Tensor> handles, want;
    for (int64_t n : {1000, 4999, 7, 3000}) {
      want.push_back(torch::randn({n}).to(dtype));
      handles.push_back(want.back().clone());
      swapper.add(handles.back());
    }
    const std::string folder = dir.path() + "/zero_stage_3/" +
                               (dtype == at::kFloat ? "float32" : "bfloat16") + "params/rank1";
    EXPECT_EQ(swapper.swap_folder(), folder);
    for (int id = 0; id < 4; ++id) {
      EXPECT_TRUE(std::filesystem::exists(folder + "/" + std::to_string(id) + "_param.tensor.swp"));
      EXPECT_EQ(handles[id].numel(), 0) << "registered shards leave memory";
      EXPECT_FALSE(swapper.in_memory(id));
    }
    for (int round = 0; round < 2; ++round) {
      for (int id = 0; id < 4; id += 2) {
        swapper.swap_in({id, id + 1});
        EXPECT_TRUE(torch::equal(handles[id], want[id]));
        EXPECT_TRUE(torch::equal(handles[id + 1], want[id + 1]));
        swapper.release({id, id + 1});
        EXPECT_EQ(handles[id].numel(), 0);
      }
    }
    EXPECT_EQ(swapper.reads(), 8);
    EXPECT_LE(swapper.buffer_bytes(), 2 * (4999 * 4 + 4096));
    // Each file 4 KiB-aligned: fp32 4096 + 20480 + 4096 + 12288, bf16 4096 + 12288 + 4096 + 8192.
    EXPECT_EQ(swapper.swapped_bytes(), dtype == at::kFloat ? 40960 : 28672);
  }
}

TEST(ShardSwapper, SmallShardsShareABuffer) {
  TempDir dir("ds_shards");
  auto o = options(dir.path(), at::kFloat);
  o.buffer_count = 1;
  ShardSwapper swapper(o);
  std::vector<at::Tensor> shards, want;
  for (int k = 0; k < 4; ++k) {
    want.push_back(torch::randn({1000}));
    shards.push_back(want.back().clone());
    swapper.add(shards.back());
  }
  swapper.swap_in({0, 1, 2, 3});  // 4 x 4 KiB in one buffer of 4000 elements (16 KiB)
  for (int k = 0; k < 4; ++k) EXPECT_TRUE(torch::equal(shards[k], want[k])) << k;
  EXPECT_EQ(swapper.buffer_bytes(), 16384);
  swapper.release({0, 1});
  // The buffer returns to the pool only when its last shard leaves.
  EXPECT_THROW_WITH(swapper.swap_in({0}), ConfigError, "cannot hold the 1 parameter shards");
  swapper.release({2, 3});
  swapper.swap_in({3, 0});
  EXPECT_TRUE(torch::equal(shards[0], want[0]));
  EXPECT_TRUE(torch::equal(shards[3], want[3]));
}

TEST(ShardSwapper, PrefetchReadsOnceAndWritesGoThrough) {
  TempDir dir("ds_shards");
  ShardSwapper swapper(options(dir.path(), at::kFloat));
  at::Tensor a = torch::randn({3000}), b = torch::randn({2000});
  swapper.add(a);
  swapper.add(b);
  swapper.prefetch({0, 1});
  EXPECT_EQ(swapper.reads(), 2);
  swapper.swap_in({0, 1});
  EXPECT_EQ(swapper.reads(), 2) << "swap_in waits for the read-ahead instead of reading again";
  swapper.release({0, 1});
  // A write while the shard is on disk, and one while it is in memory.
  at::Tensor new_a = torch::full({3000}, 1.5), new_b = torch::full({2000}, -2.0);
  swapper.write(0, new_a);
  swapper.swap_in({1});
  swapper.write(1, new_b.to(at::kDouble));  // converted to the swapper's dtype
  EXPECT_TRUE(torch::equal(b, new_b)) << "the in-memory copy follows the write";
  swapper.release({1});
  swapper.swap_in({0, 1});
  EXPECT_TRUE(torch::equal(a, new_a));
  EXPECT_TRUE(torch::equal(b, new_b));
}

TEST(ShardSwapper, MaxInCpuKeepsTheFirstShards) {
  TempDir dir("ds_shards");
  auto o = options(dir.path(), at::kFloat);
  o.max_in_cpu = 2500;
  ShardSwapper swapper(o);
  at::Tensor a = torch::randn({1000}), b = torch::randn({1000}), c = torch::randn({1000});
  for (auto* t : {&a, &b, &c}) swapper.add(*t);
  EXPECT_FALSE(swapper.swapped(0));
  EXPECT_FALSE(swapper.swapped(1));
  EXPECT_TRUE(swapper.swapped(2)) << "1000 more elements would pass max_in_cpu 2500";
  EXPECT_EQ(a.numel(), 1000);
  EXPECT_EQ(c.numel(), 0);
  EXPECT_FALSE(std::filesystem::exists(swapper.swap_path(0)));
  EXPECT_EQ(swapper.resident_bytes(), 2 * 4096);
  swapper.write(0, torch::zeros({1000}));
  EXPECT_EQ(a.abs().sum().item<double>(), 0.0);
}

TEST(ShardSwapper, ErrorsNameTheKeyOrTheFile) {
  TempDir dir("ds_shards");
  {
    ShardSwapper swapper(options(dir.path(), at::kFloat));
    at::Tensor big = torch::randn({5001});
    EXPECT_THROW_WITH(swapper.add(big), ConfigError,
                      "zero_optimization.offload_param.buffer_size (5000 elements) is smaller "
                      "than a parameter shard of 5001 elements");
    std::vector<at::Tensor> shards = {torch::randn({10}), torch::randn({10}), torch::randn({10})};
    for (auto& s : shards) swapper.add(s);
    // Buffers shrink to what the swapped shards need (30 elements: one 4 KiB page), so each
    // holds one of these and three do not fit in two.
    EXPECT_THROW_WITH(swapper.swap_in({0, 1, 2}), ConfigError,
                      "zero_optimization.offload_param.buffer_count (2) buffers of 1024 elements "
                      "(offload_param.buffer_size 5000) cannot hold the 3 parameter shards");
    std::filesystem::resize_file(swapper.swap_path(1), 4);
    EXPECT_THROW_WITH(swapper.swap_in({1}), aio::AioError, swapper.swap_path(1));
    std::filesystem::remove(swapper.swap_path(2));
    EXPECT_THROW_WITH(swapper.swap_in({2}), aio::AioError, swapper.swap_path(2));
    swapper.swap_in({0});  // the failures gave their buffers back
    EXPECT_EQ(shards[0].numel(), 10);
  }
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/zero_stage_3/float32params/rank1"))
      << "the swapper removes its files";
  testing::write_text_file(dir.file("a_file"), "x");
  EXPECT_THROW_WITH(ShardSwapper(options(dir.file("a_file"), at::kFloat)), aio::AioError,
                    "cannot create the parameter swap folder " + dir.file("a_file"));
}

}  // namespace
}  // namespace deepspeed::runtime::swap

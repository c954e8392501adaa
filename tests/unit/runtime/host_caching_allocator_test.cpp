// HostCachingAllocator: large CPU blocks are reused, small ones bypass it, tensors stay correct.
#include "runtime/host_caching_allocator.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace deepspeed::runtime {
namespace {

TEST(HostCachingAllocator, ReusesFreedLargeBlocks) {
  install_host_caching_allocator();
  install_host_caching_allocator();  // idempotent
  ASSERT_TRUE(host_caching_allocator_installed());
  empty_host_cache();
  auto before = host_cache_stats();

  void* first = nullptr;
  {
    auto t = torch::empty({8 << 20}, torch::kFloat);  // 32 MiB
    first = t.data_ptr();
    EXPECT_GE(host_cache_stats().in_use_bytes, before.in_use_bytes + (32 << 20));
  }
  EXPECT_GE(host_cache_stats().cached_bytes, 32 << 20);
  {
    // Same size class: the freed block comes back.
    auto t = torch::ones({8 << 20}, torch::kFloat);
    EXPECT_EQ(t.data_ptr(), first);
    EXPECT_EQ(t.sum().item<double>(), static_cast<double>(8 << 20));
  }
  auto after = host_cache_stats();
  EXPECT_EQ(after.hits, before.hits + 1);
  EXPECT_EQ(after.misses, before.misses + 1);

  // Small allocations are not cached.
  auto small = torch::ones({16}, torch::kFloat);
  EXPECT_EQ(host_cache_stats().hits, after.hits);
  EXPECT_EQ(host_cache_stats().misses, after.misses);

  // A much smaller request does not take the big block.
  {
    auto t = torch::empty({1 << 20}, torch::kFloat);  // 4 MiB
    EXPECT_NE(t.data_ptr(), first);
  }
  empty_host_cache();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

TEST(HostCachingAllocator, TrainingNumericsUnchanged) {
  install_host_caching_allocator();
  torch::manual_seed(0);
  auto a = torch::randn({700, 900});
  auto b = torch::randn({900, 600});
  auto c1 = torch::mm(a, b);
  auto c2 = torch::mm(a.clone(), b.clone());
  EXPECT_TRUE(torch::equal(c1, c2));
}

}  // namespace
}  // namespace deepspeed::runtime

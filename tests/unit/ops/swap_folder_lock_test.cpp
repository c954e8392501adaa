// SwapFolderLock (src/runtime/swap/swap_folder_lock.h): a second swapper on the same nvme_path
// and rank fails at construction naming the path, the holder's pid and the lock file, whether
// the holder is another engine of this process or another process; a lock left by a process
// that died does not block; other ranks' folders are not affected.
#include "runtime/swap/swap_folder_lock.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "runtime/swap/optimizer_swapper.h"
#include "runtime/swap/shard_swapper.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::runtime::swap {
namespace {

using testing::TempDir;

SwapperOptions optimizer_options(const std::string& dir, int rank) {
  SwapperOptions o;
  o.nvme_path = dir;
  o.rank = rank;
  o.buffer_count = 1;
  o.aio.block_size = 4096;
  return o;
}

ShardSwapperOptions shard_options(const std::string& dir, int rank) {
  ShardSwapperOptions o;
  o.nvme_path = dir;
  o.rank = rank;
  o.buffer_count = 1;
  o.aio.block_size = 4096;
  return o;
}

TEST(SwapFolderLock, SecondOptimizerSwapperOnTheSameFolderFailsNamingPathAndHolder) {
  TempDir dir("ds_swap_lock");
  OptimizerSwapper first(optimizer_options(dir.path(), 0));
  const std::string lock_file = first.swap_folder() + "/deepspeed_swap.lock";
  EXPECT_TRUE(std::filesystem::exists(lock_file));
  EXPECT_THROW_WITH(OptimizerSwapper(optimizer_options(dir.path(), 0)), ConfigError,
                    "zero_optimization.offload_optimizer: nvme_path " + dir.path() +
                        " is in use by another engine of this process (pid " +
                        std::to_string(::getpid()) + " on host ");
  EXPECT_THROW_WITH(OptimizerSwapper(optimizer_options(dir.path(), 0)), ConfigError,
                    "lock file " + lock_file + ")");
  // Rank 1 of the same job has a folder of its own.
  EXPECT_NO_THROW({ OptimizerSwapper again(optimizer_options(dir.path(), 1)); });
}

TEST(SwapFolderLock, SecondShardSwapperOnTheSameFolderFails) {
  TempDir dir("ds_swap_lock");
  ShardSwapper first(shard_options(dir.path(), 2));
  EXPECT_THROW_WITH(ShardSwapper(shard_options(dir.path(), 2)), ConfigError,
                    "zero_optimization.offload_param: nvme_path " + dir.path() + " is in use");
}

TEST(SwapFolderLock, ReleasedWhenTheSwapperGoes) {
  TempDir dir("ds_swap_lock");
  std::string lock_file;
  {
    OptimizerSwapper first(optimizer_options(dir.path(), 0));
    lock_file = first.swap_folder() + "/deepspeed_swap.lock";
  }
  EXPECT_FALSE(std::filesystem::exists(lock_file));
  EXPECT_NO_THROW({ OptimizerSwapper again(optimizer_options(dir.path(), 0)); });
}

// Another process (a forked child that only takes the lock: no LibTorch work in it) holds the
// folder; once it is killed, its lock file stays behind but blocks nobody.
TEST(SwapFolderLock, AnotherProcessBlocksUntilItDiesAndItsStaleFileDoesNot) {
  TempDir dir("ds_swap_lock");
  const std::string folder = dir.path() + "/zero_stage_3/optimizer/rank0";
  std::filesystem::create_directories(folder);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    int code = 0;
    try {
      new SwapFolderLock(folder, "zero_optimization.offload_optimizer", dir.path());  // held until killed
      char c = 'y';
      if (::write(ready[1], &c, 1) != 1) code = 3;
      for (;;) ::pause();
    } catch (...) {
      code = 4;
    }
    ::_exit(code);
  }
  ::close(ready[1]);
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  EXPECT_THROW_WITH(OptimizerSwapper(optimizer_options(dir.path(), 0)), ConfigError,
                    "nvme_path " + dir.path() + " is in use by another job (pid " +
                        std::to_string(child) + " on host ");
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(std::filesystem::exists(folder + "/deepspeed_swap.lock"));  // stale
  EXPECT_NO_THROW({ OptimizerSwapper again(optimizer_options(dir.path(), 0)); });
}

}  // namespace
}  // namespace deepspeed::runtime::swap

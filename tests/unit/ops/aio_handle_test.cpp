// AioHandle (include/deepspeed/aio.h): round trips of awkward sizes through every submission
// mode, many transfers in flight at once, and errors that name the file: a directory that cannot
// be written, a missing or truncated file, a device that fills up mid-transfer.
#include "deepspeed/aio.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::aio {
namespace {

using testing::TempDir;

int64_t file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// Elements of 4 bytes: 0, 1, a block minus one, a block, a block plus one, several blocks plus a
// tail that is not a multiple of the O_DIRECT alignment.
const std::vector<int64_t> kAwkwardNumels = {0, 1, 1023, 1024, 1025, 4097, 3 * 1024 + 7,
                                             10 * 1024 + 333};

struct Mode {
  const char* name;
  AioOptions options;
};

std::vector<Mode> modes() {
  // Small blocks (4 KiB = 1024 floats) so that the sizes above span several requests.
  AioOptions base;
  base.block_size = 4096;
  base.queue_depth = 4;
  std::vector<Mode> out;
  out.push_back({"overlap", base});
  AioOptions batch = base;
  batch.overlap_events = false;
  out.push_back({"batched", batch});
  AioOptions single = base;
  single.single_submit = true;
  out.push_back({"single_submit", single});
  AioOptions threads = base;
  threads.intra_op_parallelism = 3;
  out.push_back({"3 threads", threads});
  AioOptions buffered = base;
  buffered.o_direct = false;
  out.push_back({"buffered", buffered});
  AioOptions depth1 = base;
  depth1.queue_depth = 1;
  out.push_back({"queue_depth 1", depth1});
  return out;
}

TEST(AioHandle, RoundTripsAwkwardSizesInEveryMode) {
  TempDir dir("ds_aio");
  for (const auto& mode : modes()) {
    AioHandle handle(mode.options);
    for (int64_t n : kAwkwardNumels) {
      for (bool aligned : {true, false}) {
        SCOPED_TRACE(std::string(mode.name) + ", numel " + std::to_string(n) +
                     (aligned ? ", aligned buffer" : ", unaligned buffer"));
        // An unaligned buffer: a view one element into a larger tensor.
        at::Tensor src = aligned ? new_aligned_tensor(n, at::kFloat)
                                 : torch::empty({n + 1}).narrow(0, 1, n);
        src.copy_(torch::randn({n}));
        const std::string path = dir.file("t" + std::to_string(n) + ".swp");
        handle.async_pwrite(src, path);
        EXPECT_EQ(handle.wait(), 1);
        EXPECT_EQ(file_size(path), n * 4);
        at::Tensor dst = aligned ? new_aligned_tensor(n, at::kFloat)
                                 : torch::empty({n + 1}).narrow(0, 1, n);
        dst.fill_(-7.0f);
        handle.async_pread(dst, path);
        EXPECT_EQ(handle.wait(), 1);
        EXPECT_TRUE(torch::equal(src, dst));
      }
    }
  }
}

TEST(AioHandle, RewritingAShorterTensorLeavesTheExactSize) {
  TempDir dir("ds_aio");
  AioHandle handle;
  const std::string path = dir.file("x.swp");
  handle.sync_pwrite(torch::randn({100000}), path);
  at::Tensor small = torch::arange(5, torch::kFloat);
  handle.sync_pwrite(small, path);
  EXPECT_EQ(file_size(path), 20);
  at::Tensor back = torch::empty({5});
  handle.sync_pread(back, path);
  EXPECT_TRUE(torch::equal(small, back));
}

TEST(AioHandle, ManyConcurrentTransfersCompleteAndCount) {
  TempDir dir("ds_aio");
  AioOptions o;
  o.block_size = 8192;
  o.queue_depth = 8;
  o.intra_op_parallelism = 2;
  AioHandle handle(o);
  constexpr int kCount = 64;
  std::vector<at::Tensor> src, dst;
  for (int i = 0; i < kCount; ++i) {
    src.push_back(torch::full({1000 + 97 * i}, static_cast<float>(i)) +
                  torch::arange(1000 + 97 * i, torch::kFloat));
    handle.async_pwrite(src.back(), dir.file("c" + std::to_string(i)));
  }
  EXPECT_EQ(handle.pending(), kCount);
  EXPECT_EQ(handle.wait(), kCount);
  EXPECT_EQ(handle.pending(), 0);
  for (int i = 0; i < kCount; ++i) {
    dst.push_back(torch::empty_like(src[static_cast<size_t>(i)]));
    handle.async_pread(dst.back(), dir.file("c" + std::to_string(i)));
  }
  EXPECT_EQ(handle.wait(), kCount);
  for (int i = 0; i < kCount; ++i) {
    EXPECT_TRUE(torch::equal(src[static_cast<size_t>(i)], dst[static_cast<size_t>(i)])) << i;
  }
}

TEST(AioHandle, ReadingAMissingFileNamesIt) {
  TempDir dir("ds_aio");
  AioHandle handle;
  at::Tensor t = torch::empty({10});
  const std::string path = dir.file("absent.swp");
  EXPECT_THROW_WITH(handle.async_pread(t, path), AioError, path);
  EXPECT_THROW_WITH(handle.async_pread(t, path), AioError, "No such file or directory");
  EXPECT_EQ(handle.wait(), 0);
}

TEST(AioHandle, ReadingATruncatedFileNamesItAndBothSizes) {
  TempDir dir("ds_aio");
  AioHandle handle;
  const std::string path = dir.file("short.swp");
  handle.sync_pwrite(torch::randn({1000}), path);
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  at::Tensor t = torch::empty({1000});
  EXPECT_THROW_WITH(handle.sync_pread(t, path), AioError, path + " holds 1000 bytes");
  EXPECT_THROW_WITH(handle.sync_pread(t, path), AioError, "has 4000");
}

TEST(AioHandle, WritingIntoAMissingDirectoryOrThroughAFileNamesIt) {
  TempDir dir("ds_aio");
  AioHandle handle;
  at::Tensor t = torch::randn({10});
  const std::string missing = dir.file("no/such/dir/x.swp");
  EXPECT_THROW_WITH(handle.async_pwrite(t, missing), AioError, missing);
  EXPECT_THROW_WITH(handle.async_pwrite(t, missing), AioError, "does its directory exist?");
  testing::write_text_file(dir.file("plain"), "x");
  const std::string through_file = dir.file("plain/x.swp");
  EXPECT_THROW_WITH(handle.async_pwrite(t, through_file), AioError, "Not a directory");
}

// A read-only directory: root ignores permission bits, so as root the attempt runs in a child
// that has given up root (setuid to nobody) first.
TEST(AioHandle, WritingIntoAReadOnlyDirectoryNamesTheFile) {
  TempDir dir("ds_aio");
  const std::string ro = dir.file("ro");
  ASSERT_EQ(::mkdir(ro.c_str(), 0755), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  const std::string path = ro + "/x.swp";
  const at::Tensor t = torch::randn({10});  // made before fork(): the child runs no torch op
  auto attempt = [&]() -> std::string {
    AioHandle handle;
    try {
      handle.sync_pwrite(t, path);
    } catch (const AioError& e) {
      return e.what();
    }
    return "";
  };
  if (::geteuid() != 0) {
    const std::string message = attempt();
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
    return;
  }
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    std::string message = "setuid failed";
    if (::setgid(65534) == 0 && ::setuid(65534) == 0) message = attempt();
    (void)!::write(fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string message;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fds[0], buf, sizeof(buf))) > 0) message.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("Permission denied"), std::string::npos) << message;
  EXPECT_NE(message.find("writable"), std::string::npos) << message;
}

// A device that fills up mid-transfer: RLIMIT_FSIZE makes writes past 64 KiB fail with EFBIG,
// for root too. The failure surfaces from wait(), naming the file and the offset.
TEST(AioHandle, AWriteFailingMidTransferIsReportedByWait) {
  TempDir dir("ds_aio");
  AioOptions o;
  o.block_size = 16384;
  AioHandle handle(o);
  struct rlimit old {};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = old;
  limited.rlim_cur = 65536;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &limited), 0);
  const std::string path = dir.file("big.swp");
  std::string message;
  handle.async_pwrite(torch::randn({100000}), path);  // 400 KB
  try {
    handle.wait();
  } catch (const AioError& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, old_handler);
  EXPECT_NE(message.find("aio: write of " + path + " failed at offset"), std::string::npos)
      << message;
  EXPECT_NE(message.find("File too large"), std::string::npos) << message;
  // The handle is usable after a failure.
  at::Tensor t = torch::randn({10});
  handle.sync_pwrite(t, path);
  at::Tensor back = torch::empty({10});
  handle.sync_pread(back, path);
  EXPECT_TRUE(torch::equal(t, back));
}

TEST(AioHandle, RejectsBadOptionsByName) {
  AioOptions o;
  o.block_size = 1000;
  EXPECT_THROW_WITH(AioHandle{o}, ConfigError, "aio.block_size is 1000");
  o = AioOptions{};
  o.queue_depth = 0;
  EXPECT_THROW_WITH(AioHandle{o}, ConfigError, "aio.queue_depth");
  AioConfig c;
  c.use_gds = true;
  EXPECT_THROW_WITH(AioOptions::from_config(c, "ds_config.json"), ConfigError, "aio.use_gds");
}

TEST(AioHandle, AlignedTensorsAreAligned) {
  for (int64_t n : {0, 1, 1000, 4097}) {
    at::Tensor t = new_aligned_tensor(n, at::kBFloat16);
    EXPECT_EQ(t.numel(), n);
    EXPECT_EQ(t.scalar_type(), at::kBFloat16);
    if (n > 0) EXPECT_TRUE(is_aligned(t));
  }
  EXPECT_FALSE(is_aligned(new_aligned_tensor(8, at::kFloat).narrow(0, 1, 4)));
}

}  // namespace
}  // namespace deepspeed::aio

// aio_bench: write and read bandwidth of our AIO engine (libaio, O_DIRECT, aio section defaults)
// against plain pwrite/pread loops of the same block size through the page cache, on one file of
// SIZE_MB in DIR. Rounds alternate the order; prints the median GB/s of each and the ratios.
// Both sides reach the device: the plain write is timed up to its fsync, and its pages are
// then dropped from the page cache (posix_fadvise DONTNEED) so that the plain read comes from
// the device as the O_DIRECT one does.
// Usage: aio_bench DIR [SIZE_MB=256] [ROUNDS=5]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "deepspeed/aio.h"

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void plain_io(bool write, char* data, int64_t bytes, const std::string& path, int64_t block) {
  const int fd = write ? ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)
                       : ::open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    std::perror(path.c_str());
    std::exit(1);
  }
  for (int64_t off = 0; off < bytes; off += block) {
    const size_t n = static_cast<size_t>(std::min(block, bytes - off));
    const ssize_t r = write ? ::pwrite(fd, data + off, n, off) : ::pread(fd, data + off, n, off);
    if (r != static_cast<ssize_t>(n)) {
      std::perror("plain io");
      std::exit(1);
    }
  }
  if (write) {
    ::fsync(fd);  // the aio writes are O_DIRECT: count the plain ones to the device too
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  }
  ::close(fd);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: aio_bench DIR [SIZE_MB=256] [ROUNDS=5]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t mb = argc > 2 ? std::atoll(argv[2]) : 256;
  const int rounds = argc > 3 ? std::atoi(argv[3]) : 5;
  const int64_t bytes = mb << 20;
  deepspeed::aio::AioOptions options;  // DeepSpeed's aio defaults: 1 MiB blocks, depth 8
  deepspeed::aio::AioHandle handle(options);
  at::Tensor buf = deepspeed::aio::new_aligned_tensor(bytes, at::kByte);
  buf.random_(0, 255);
  at::Tensor check = deepspeed::aio::new_aligned_tensor(bytes, at::kByte);
  const std::string aio_path = dir + "/aio_bench.aio.swp";
  const std::string plain_path = dir + "/aio_bench.plain.swp";
  std::vector<double> aio_w, aio_r, plain_w, plain_r;
  for (int r = 0; r < rounds; ++r) {
    auto run_aio = [&] {
      double t = now_s();
      handle.sync_pwrite(buf, aio_path);
      aio_w.push_back(bytes / (now_s() - t) / 1e9);
      t = now_s();
      handle.sync_pread(check, aio_path);
      aio_r.push_back(bytes / (now_s() - t) / 1e9);
    };
    auto run_plain = [&] {
      double t = now_s();
      plain_io(true, static_cast<char*>(buf.data_ptr()), bytes, plain_path, options.block_size);
      plain_w.push_back(bytes / (now_s() - t) / 1e9);
      t = now_s();
      plain_io(false, static_cast<char*>(check.data_ptr()), bytes, plain_path, options.block_size);
      plain_r.push_back(bytes / (now_s() - t) / 1e9);
    };
    if (r % 2 == 0) {
      run_aio();
      run_plain();
    } else {
      run_plain();
      run_aio();
    }
    if (!at::equal(buf, check)) {
      std::fprintf(stderr, "round %d: data read back differs\n", r);
      return 1;
    }
  }
  ::unlink(aio_path.c_str());
  ::unlink(plain_path.c_str());
  std::printf("RESULT aio_write_GBps %.3f\nRESULT aio_read_GBps %.3f\n", median(aio_w),
              median(aio_r));
  std::printf("RESULT plain_write_GBps %.3f\nRESULT plain_read_GBps %.3f\n", median(plain_w),
              median(plain_r));
  std::printf("RATIO aio/plain write %.2f\nRATIO aio/plain read %.2f\n",
              median(aio_w) / median(plain_w), median(aio_r) / median(plain_r));
  std::printf("INFO %s, %lld MiB, %d rounds, block %lld B, queue_depth %lld, O_DIRECT %s\n",
              dir.c_str(), static_cast<long long>(mb), rounds,
              static_cast<long long>(options.block_size),
              static_cast<long long>(options.queue_depth),
              handle.used_buffered_fallback() ? "refused (buffered fallback)" : "yes");
  return 0;
}

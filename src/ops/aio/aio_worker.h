// AioWorker: one thread of the AIO engine with its own kernel AIO context. It carries out parts
// of transfers (a byte range of one tensor to or from one file) as requests of block_size bytes,
// queue_depth in flight, and reports each finished part to its owner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <libaio.h>

#include <ATen/core/Tensor.h>

#include "deepspeed/aio.h"
#include "ops/aio/aio_file.h"

namespace deepspeed::aio::detail {

/// One tensor to or from one file, split into parts across workers.
struct Transfer {
  bool write = false;
  std::string path;
  FileDescriptor fd;
  char* data = nullptr;
  int64_t nbytes = 0;
  at::Tensor keep_alive;  // the caller's buffer stays valid until the transfer ends
  std::atomic<int> parts_left{0};
  std::mutex error_mutex;
  std::string error;  // the first failure of any part; empty when all went well
};

struct TransferPart {
  std::shared_ptr<Transfer> transfer;
  int64_t begin = 0;  // byte range of the tensor (and the file)
  int64_t end = 0;
};

class AioWorker {
 public:
  /// `on_part_done(part, error)` runs on the worker thread after each part (error empty on
  /// success). Throws AioError when io_setup fails.
  AioWorker(const AioOptions& options,
            std::function<void(TransferPart&, const std::string&)> on_part_done);
  ~AioWorker();
  AioWorker(const AioWorker&) = delete;
  AioWorker& operator=(const AioWorker&) = delete;

  void enqueue(TransferPart part);

 private:
  void run();
  /// Moves the bytes of `part`; returns the first error, or "" on success.
  std::string transfer(const TransferPart& part);
  char* bounce_buffer();

  AioOptions options_;
  std::function<void(TransferPart&, const std::string&)> on_part_done_;
  io_context_t context_ = nullptr;
  // Aligned staging for blocks whose address or length O_DIRECT cannot take as they are (the
  // tail of an awkward size, a tensor not from new_aligned_tensor): queue_depth blocks.
  std::unique_ptr<char, void (*)(void*)> bounce_{nullptr, nullptr};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<TransferPart> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace deepspeed::aio::detail

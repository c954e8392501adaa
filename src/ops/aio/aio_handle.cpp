// AioHandle: splits each tensor transfer across the workers and collects completions for
// wait(). See include/deepspeed/aio.h for the contract.
#include "deepspeed/aio.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <ATen/ATen.h>

#include "ops/aio/aio_worker.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::aio {

using detail::AioWorker;
using detail::Transfer;
using detail::TransferPart;

AioOptions AioOptions::from_config(const AioConfig& config, const std::string& source) {
  DS_CHECK(!config.use_gds, ConfigError, source,
           ": aio.use_gds (GPUDirect Storage) needs CUDA and cuFile; this build has neither");
  AioOptions o;
  o.block_size = config.block_size;
  o.queue_depth = config.queue_depth;
  o.intra_op_parallelism = config.intra_op_parallelism;
  o.single_submit = config.single_submit;
  o.overlap_events = config.overlap_events;
  return o;
}

at::Tensor new_aligned_tensor(int64_t numel, at::ScalarType dtype) {
  DS_CHECK(numel >= 0, UsageError, "new_aligned_tensor: numel is ", numel);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t alloc = std::max<int64_t>(kDirectIoAlignment,
                                          (bytes + kDirectIoAlignment - 1) / kDirectIoAlignment *
                                              kDirectIoAlignment);
  void* p = nullptr;
  if (posix_memalign(&p, kDirectIoAlignment, static_cast<size_t>(alloc)) != 0) {
    throw std::bad_alloc();
  }
  return at::from_blob(p, {numel}, [](void* q) { std::free(q); },
                       at::TensorOptions().dtype(dtype).device(at::kCPU));
}

bool is_aligned(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % kDirectIoAlignment == 0;
}

class AioHandle::Impl {
 public:
  explicit Impl(AioOptions options) : options_(options) {
    DS_CHECK(options_.block_size > 0 && options_.block_size % kDirectIoAlignment == 0,
             ConfigError, "aio.block_size is ", options_.block_size,
             "; it must be a positive multiple of ", kDirectIoAlignment,
             " (the O_DIRECT alignment)");
    DS_CHECK(options_.queue_depth >= 1, ConfigError, "aio.queue_depth is ",
             options_.queue_depth, "; it must be at least 1");
    DS_CHECK(options_.intra_op_parallelism >= 1, ConfigError, "aio.intra_op_parallelism is ",
             options_.intra_op_parallelism, "; it must be at least 1");
    for (int64_t i = 0; i < options_.intra_op_parallelism; ++i) {
      workers_.push_back(std::make_unique<AioWorker>(
          options_, [this](TransferPart& part, const std::string& error) {
            part_done(part, error);
          }));
    }
  }

  ~Impl() {
    try {
      wait();
    } catch (const std::exception& e) {
      log::warn(std::string("aio: a transfer failed and nobody waited for it: ") + e.what());
    }
    workers_.clear();  // joins the threads before the members they use go away
  }

  void start(bool write, const at::Tensor& buffer, const std::string& path) {
    const char* op = write ? "async_pwrite" : "async_pread";
    DS_CHECK(buffer.defined() && buffer.device().is_cpu() && buffer.is_contiguous(), UsageError,
             "aio ", op, "(", path, "): the buffer must be a contiguous CPU tensor");
    auto t = std::make_shared<Transfer>();
    t->write = write;
    t->path = path;
    t->nbytes = static_cast<int64_t>(buffer.nbytes());
    t->data = static_cast<char*>(buffer.data_ptr());
    t->keep_alive = buffer;
    t->fd = write ? detail::open_for_write(path, options_.o_direct)
                  : detail::open_for_read(path, t->nbytes, options_.o_direct);
    if (options_.o_direct && !t->fd.direct() && !buffered_) {
      buffered_ = true;  // warn once per handle, not once per file
      log::warn("aio: the filesystem of " + path + " refuses O_DIRECT; its swap files go "
                "through the page cache (slower, and they take host memory)");
    }

    std::vector<TransferPart> parts;
    const int64_t block = options_.block_size;
    const int64_t blocks = (t->nbytes + block - 1) / block;
    const int64_t workers = static_cast<int64_t>(workers_.size());
    const int64_t per_worker = (blocks + workers - 1) / workers;
    for (int64_t w = 0; w < workers && per_worker > 0; ++w) {
      const int64_t begin = w * per_worker * block;
      const int64_t end = std::min(t->nbytes, (w + 1) * per_worker * block);
      if (begin < end) parts.push_back(TransferPart{t, begin, end});
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++pending_;
    }
    if (parts.empty()) {  // an empty tensor: nothing to move, only the file's size to settle
      finish(*t);
      return;
    }
    t->parts_left = static_cast<int>(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) workers_[i]->enqueue(std::move(parts[i]));
  }

  int64_t wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return pending_ == 0; });
    const int64_t finished = finished_;
    finished_ = 0;
    std::vector<std::string> errors;
    errors.swap(errors_);
    lock.unlock();
    if (!errors.empty()) {
      std::string msg = errors.front();
      if (errors.size() > 1) {
        msg += " (and " + std::to_string(errors.size() - 1) + " more failed transfer(s))";
      }
      throw AioError(msg);
    }
    return finished;
  }

  int64_t pending() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return pending_ + finished_;
  }

  const AioOptions& options() const { return options_; }
  bool buffered() const { return buffered_; }

 private:
  void part_done(TransferPart& part, const std::string& error) {
    Transfer& t = *part.transfer;
    if (!error.empty()) {
      std::lock_guard<std::mutex> lock(t.error_mutex);
      if (t.error.empty()) t.error = error;
    }
    if (--t.parts_left == 0) finish(t);
  }

  // The last part of a transfer: set the file's exact size (O_DIRECT wrote whole blocks, and
  // an older file may have been longer), close, and report.
  void finish(Transfer& t) {
    std::string error = t.error;
    if (t.write && error.empty() && ::ftruncate(t.fd.get(), t.nbytes) != 0) {
      error = "aio: write of " + t.path + " failed setting its size to " +
              std::to_string(t.nbytes) + " bytes: " + detail::errno_text(errno);
    }
    const int close_err = t.fd.close();
    if (close_err != 0 && error.empty()) {
      error = "aio: closing " + t.path + " failed: " + detail::errno_text(close_err);
    }
    t.keep_alive = at::Tensor();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error.empty()) errors_.push_back(error);
      --pending_;
      ++finished_;
    }
    done_.notify_all();
  }

  AioOptions options_;
  std::vector<std::unique_ptr<AioWorker>> workers_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  int64_t pending_ = 0;   // started, not finished
  int64_t finished_ = 0;  // finished since the last wait()
  std::vector<std::string> errors_;
  bool buffered_ = false;  // some file was opened without the O_DIRECT asked for
};

AioHandle::AioHandle(AioOptions options) : impl_(std::make_unique<Impl>(options)) {}
AioHandle::~AioHandle() = default;

void AioHandle::async_pwrite(const at::Tensor& buffer, const std::string& path) {
  impl_->start(/*write=*/true, buffer, path);
}
void AioHandle::async_pread(const at::Tensor& buffer, const std::string& path) {
  impl_->start(/*write=*/false, buffer, path);
}
int64_t AioHandle::wait() { return impl_->wait(); }

void AioHandle::sync_pwrite(const at::Tensor& buffer, const std::string& path) {
  async_pwrite(buffer, path);
  wait();
}
void AioHandle::sync_pread(const at::Tensor& buffer, const std::string& path) {
  async_pread(buffer, path);
  wait();
}

int64_t AioHandle::pending() const { return impl_->pending(); }
const AioOptions& AioHandle::options() const { return impl_->options(); }
bool AioHandle::used_buffered_fallback() const { return impl_->buffered(); }

}  // namespace deepspeed::aio

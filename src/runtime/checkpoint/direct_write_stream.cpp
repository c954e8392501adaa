// DirectWriteStream: see Note [O_DIRECT checkpoint writes].
#include "runtime/checkpoint/direct_write_stream.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::checkpoint {
namespace {

constexpr int64_t kAlignment = 4096;  // aio::kDirectIoAlignment: 512-byte and 4 KiB devices

void warn_once_without_direct_io(const std::string& path) {
  static std::once_flag once;
  std::call_once(once, [&] {
    log::warn("checkpoint.writer FAST: the file system of " + path +
              " refuses O_DIRECT; the staged buffers are written through the page cache");
  });
}

}  // namespace

void DirectWriteStream::FreeDeleter::operator()(char* p) const { std::free(p); }

DirectWriteStream::DirectWriteStream(AtomicFile& file, int64_t buffer_bytes, bool double_buffer)
    : file_(file), count_(double_buffer ? 2 : 1) {
  half_bytes_ = buffer_bytes / count_;
  DS_CHECK(half_bytes_ > 0 && half_bytes_ % kAlignment == 0, UsageError,
           "checkpoint writer: io_buffer_size ", buffer_bytes, " must be a multiple of ",
           kAlignment * count_);
  void* p = nullptr;
  DS_CHECK(::posix_memalign(&p, kAlignment, static_cast<size_t>(half_bytes_ * count_)) == 0,
           CheckpointError, file_.path(), ": cannot allocate the writer's ",
           half_bytes_ * count_, "-byte staging buffer");
  memory_.reset(static_cast<char*>(p));
  direct_io_ = file_.set_direct_io(true);
  if (!direct_io_) warn_once_without_direct_io(file_.path());
}

DirectWriteStream::~DirectWriteStream() {
  if (drain_.valid()) drain_.wait();
}

void DirectWriteStream::write(const void* data, size_t size) {
  const char* src = static_cast<const char*>(data);
  while (size > 0) {
    const size_t n = std::min<size_t>(size, static_cast<size_t>(half_bytes_ - filled_));
    std::memcpy(memory_.get() + fill_ * half_bytes_ + filled_, src, n);
    filled_ += static_cast<int64_t>(n);
    src += n;
    size -= n;
    if (filled_ == half_bytes_) drain_full_buffer();
  }
}

void DirectWriteStream::wait_for_drain() {
  if (drain_.valid()) drain_.get();  // rethrows the drain's CheckpointError
}

void DirectWriteStream::drain_full_buffer() {
  wait_for_drain();  // the other buffer is free again (and the file written in order)
  const char* buffer = memory_.get() + fill_ * half_bytes_;
  const int64_t bytes = filled_;
  const int64_t offset = offset_;
  if (count_ == 2) {
    drain_ = std::async(std::launch::async,
                        [this, buffer, bytes, offset] { file_.write_at(buffer, bytes, offset); });
  } else {
    file_.write_at(buffer, bytes, offset);
  }
  ++drained_;
  offset_ += bytes;
  filled_ = 0;
  fill_ = (fill_ + 1) % count_;
}

void DirectWriteStream::finish() {
  wait_for_drain();
  const char* buffer = memory_.get() + fill_ * half_bytes_;
  const int64_t aligned = filled_ / kAlignment * kAlignment;
  if (aligned > 0) {
    file_.write_at(buffer, aligned, offset_);
    ++drained_;
  }
  if (filled_ > aligned) {
    // O_DIRECT cannot write a partial block; the file's last bytes go through the page cache.
    DS_CHECK(!direct_io_ || file_.set_direct_io(false), CheckpointError, file_.path(),
             ": cannot turn O_DIRECT off for the file's last ", filled_ - aligned, " bytes");
    file_.write_at(buffer + aligned, filled_ - aligned, offset_ + aligned);
  }
  offset_ += filled_;
  filled_ = 0;
}

}  // namespace deepspeed::checkpoint

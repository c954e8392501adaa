// The FAST checkpoint writer's staging (DeepSpeed's FastFileWriter with its double IO buffer).
//
// Note [O_DIRECT checkpoint writes]
// ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
// A checkpoint written through the page cache is copied twice: into the cache by write(), then
// to the disk by fsync, which the save waits for at the end, when nothing is left to overlap it
// with. The FAST writer copies the serialized archive into aligned staging buffers instead and
// writes each full buffer with O_DIRECT straight to the device; with io_buffer_double a
// background thread drains one half while serialization fills the other, so the disk is busy
// from the first buffer on and the page cache is left to the training job. O_DIRECT needs
// aligned addresses, offsets and lengths: the buffers are 4096-aligned and full buffers are
// multiples of 4096, and only the file's last partial block goes out after O_DIRECT is turned
// off. A file system without O_DIRECT (older tmpfs) gets the same buffers through the page
// cache, with a warning once per process.
#pragma once

#include <cstdint>
#include <future>
#include <memory>

#include "deepspeed/checkpoint.h"

namespace deepspeed::checkpoint {

/// Streams bytes into `file` through one or two aligned staging buffers.
class DirectWriteStream {
 public:
  /// `buffer_bytes`: both halves together when `double_buffer` (a multiple of 8192), else the
  /// one buffer (a multiple of 4096). Turns O_DIRECT on for `file` where its file system can.
  DirectWriteStream(AtomicFile& file, int64_t buffer_bytes, bool double_buffer);
  /// Waits for a drain in flight; its error is dropped (the file is not committed then).
  ~DirectWriteStream();
  DirectWriteStream(const DirectWriteStream&) = delete;
  DirectWriteStream& operator=(const DirectWriteStream&) = delete;

  /// Appends `size` bytes. Throws CheckpointError from a failed drain.
  void write(const void* data, size_t size);
  /// Writes whatever is staged (the tail without O_DIRECT) and waits for every drain.
  void finish();

  bool direct_io() const { return direct_io_; }
  int64_t buffers_drained() const { return drained_; }

 private:
  struct FreeDeleter {
    void operator()(char* p) const;
  };
  void drain_full_buffer();
  void wait_for_drain();

  AtomicFile& file_;
  int64_t half_bytes_;  // each buffer's size
  int count_;           // 1 or 2 buffers
  std::unique_ptr<char, FreeDeleter> memory_;
  int fill_ = 0;          // the buffer being filled
  int64_t filled_ = 0;    // bytes in it
  int64_t offset_ = 0;    // file offset of its first byte
  bool direct_io_ = false;
  int64_t drained_ = 0;
  std::future<void> drain_;  // the other buffer's write, when double
};

}  // namespace deepspeed::checkpoint

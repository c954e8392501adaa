// Asynchronous file I/O of CPU tensors, the engine under ZeRO-Infinity's NVMe swapping
// (DeepSpeed's deepspeed.ops.aio `aio_handle`). Built on Linux native AIO (libaio): requests of
// `block_size` bytes, `queue_depth` of them in flight per thread, `intra_op_parallelism` threads
// splitting each tensor, O_DIRECT where the filesystem allows. docs/offload.md says why libaio.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ATen/core/Tensor.h>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed::aio {

/// An I/O failure: the message names the file, the operation, the offset where it applies and
/// the errno text, e.g. "aio: write of /nvme/x.swp failed at offset 1048576: No space left on
/// device (errno 28)".
class AioError : public Error {
 public:
  using Error::Error;
};

/// O_DIRECT needs buffer addresses, file offsets and lengths aligned to the device's logical
/// block; 4096 covers 512-byte and 4 KiB devices.
inline constexpr int64_t kDirectIoAlignment = 4096;

/// DeepSpeed's `aio` section, plus whether to try O_DIRECT.
struct AioOptions {
  int64_t block_size = 1048576;      // bytes per kernel request; a multiple of 4096
  int64_t queue_depth = 8;           // requests in flight per thread
  int64_t intra_op_parallelism = 1;  // threads splitting each tensor (legacy name thread_count)
  bool single_submit = false;        // one io_submit call per request instead of per batch
  bool overlap_events = true;        // refill the queue as requests complete, not per batch
  bool o_direct = true;              // bypass the page cache; falls back (with a warning)
                                     // where the filesystem refuses O_DIRECT

  /// The `aio` section of ds_config. Throws ConfigError for use_gds (CUDA GPUDirect Storage).
  static AioOptions from_config(const AioConfig& config, const std::string& source);
};

/// A CPU tensor of `numel` elements whose data starts on a kDirectIoAlignment boundary and whose
/// allocation is rounded up to a multiple of it, so O_DIRECT transfers need no bounce buffer.
/// DeepSpeed calls these "pinned" (new_cpu_locked_tensor); without a GPU nothing needs to be
/// page-locked, so the pages are not mlock()ed.
at::Tensor new_aligned_tensor(int64_t numel, at::ScalarType dtype);

/// Whether `t`'s data pointer is kDirectIoAlignment-aligned.
bool is_aligned(const at::Tensor& t);

/// One AIO engine: its worker threads and their kernel AIO contexts.
///
/// Async calls start a transfer and return at once. The tensor (contiguous, on CPU) is kept
/// alive by the handle but must not be modified (write) or read (read) until wait() returns.
/// Opening the file happens in the calling thread, so a path that cannot be opened (missing
/// directory, permission, read-only filesystem) or a file of the wrong size throws AioError
/// from the async call itself; failures during the transfer are reported by wait().
/// A handle is used from one thread at a time.
class AioHandle {
 public:
  /// Throws ConfigError for a block_size that is not a positive multiple of 4096, or a
  /// queue_depth / intra_op_parallelism below 1; AioError when the kernel refuses an AIO
  /// context (fs.aio-max-nr exhausted).
  explicit AioHandle(AioOptions options = {});
  /// Waits for outstanding transfers; their errors are logged, not thrown.
  ~AioHandle();
  AioHandle(const AioHandle&) = delete;
  AioHandle& operator=(const AioHandle&) = delete;

  /// Starts writing the bytes of `buffer` to `path`, which is created or replaced: after
  /// wait() it holds exactly buffer.nbytes() bytes.
  void async_pwrite(const at::Tensor& buffer, const std::string& path);
  /// Starts reading `path` into `buffer`. The file must hold exactly buffer.nbytes() bytes
  /// (AioError otherwise, as DeepSpeed's "buffer nbytes != file bytes" check).
  void async_pread(const at::Tensor& buffer, const std::string& path);
  /// Blocks until every transfer started so far has finished. Returns how many transfers
  /// finished since the previous wait(). If any failed, throws AioError with the first
  /// failure (and how many others failed) once all have finished.
  int64_t wait();

  /// async_pwrite / async_pread, then wait() (for every pending transfer, as DeepSpeed's do).
  void sync_pwrite(const at::Tensor& buffer, const std::string& path);
  void sync_pread(const at::Tensor& buffer, const std::string& path);

  /// Transfers started and not yet collected by wait().
  int64_t pending() const;
  const AioOptions& options() const;
  /// Whether some file had to be opened without O_DIRECT (its filesystem refused it).
  bool used_buffered_fallback() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepspeed::aio

// OptimizerSwapper: ZeRO-Infinity's optimizer-state swapping (DeepSpeed's
// runtime/swap_tensor/{partitioned,pipelined}_optimizer_swapper.py). A sub-group is a list of named
// CPU tensors (an fp32 master shard and its optimizer state tensors); between steps they live in
// files under <nvme_path>/zero_stage_3/optimizer/rank<R>/ and in no memory at all. For its step a
// sub-group is read into one of `buffer_count` aligned buffers; the caller's tensors are
// re-pointed (set_data) at views of that buffer, so an optimizer holding them sees the data in
// place. It knows nothing of ZeRO stages: stage 1/2 and stage 3 give it their own sub-groups.
//
// Note [Swap pipeline] step_sub_groups(fn) runs, for k = 0..n-1: swap_in(k) (waits for its
// read), prefetch(k+1) (read-ahead, with pipeline_read), fn(k), swap_out(k) (write-behind with
// pipeline_write: the write runs during fn(k+1); without it swap_out waits). Three buffers keep
// the read of k+1, the step of k and the write of k-1 in flight together.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/aio.h"

namespace deepspeed::runtime::swap {

struct NamedTensor {
  std::string name;  // part of the file name: letters, digits, '_' and '.'
  at::Tensor tensor;  // contiguous, on CPU; the handle whose storage the swapper moves
};

struct SwapperOptions {
  std::string nvme_path;      // offload_optimizer.nvme_path
  int rank = 0;               // names the folder rank<R>
  int64_t buffer_count = 4;   // offload_optimizer.buffer_count: sub-groups in memory at once
  bool pipeline_read = false;   // offload_optimizer.pipeline_read: read-ahead of the next one
  bool pipeline_write = false;  // offload_optimizer.pipeline_write: write-behind of the last one
  aio::AioOptions aio;
  /// Sub-groups smaller than this stay in memory (DeepSpeed: max(1 MiB, aio.block_size), as
  /// small transfers cost more than they free). -1: that default.
  int64_t min_swap_bytes = -1;
};

class OptimizerSwapper {
 public:
  /// Creates the swap folder. Throws ConfigError for buffer_count < 1, aio::AioError naming
  /// the folder when it cannot be created.
  explicit OptimizerSwapper(SwapperOptions options);
  /// Waits for outstanding writes and removes the swap files it wrote (they mean nothing to
  /// another process).
  ~OptimizerSwapper();
  OptimizerSwapper(const OptimizerSwapper&) = delete;
  OptimizerSwapper& operator=(const OptimizerSwapper&) = delete;

  /// Registers a sub-group and, when it is large enough to swap, writes it out and releases its
  /// memory (its tensors become empty until swap_in). Returns its id (0, 1, ...). Throws
  /// aio::AioError naming the file when it cannot be written.
  int add_sub_group(std::vector<NamedTensor> tensors);

  /// Brings sub-group `id` into memory (waiting for a read-ahead in flight): afterwards its
  /// tensors have their registered shapes and contents. Throws aio::AioError naming the file
  /// when it is missing, truncated or unreadable.
  void swap_in(int id);
  /// Starts reading `id` into a free buffer, if pipeline_read and a buffer is free; else nothing.
  void prefetch(int id);
  /// Starts writing `id` out; its tensors become empty at once and its buffer is reused once the
  /// write is done. Waits for the write unless pipeline_write. Throws aio::AioError naming the
  /// file (now, or from a later call that waits for it).
  void swap_out(int id);
  /// Waits for every read and write in flight; reports the first failure.
  void synchronize();

  /// Checkpoints: brings every sub-group into memory at once, each into memory of its own (the
  /// `buffer_count` buffers cannot hold them all), and swap_out_all() writes them back and lets
  /// that memory go. Between the two, swap_in/swap_out/prefetch are no-ops for those sub-groups
  /// and the caller may write the tensors (their new contents are what swap_out_all writes).
  void swap_in_all();
  void swap_out_all();

  /// See Note [Swap pipeline].
  void step_sub_groups(const std::function<void(int)>& step);

  int num_sub_groups() const;
  /// False for a sub-group kept in memory because it is smaller than min_swap_bytes.
  bool swappable(int id) const;
  bool in_memory(int id) const;
  /// <nvme_path>/zero_stage_3/optimizer/rank<R>
  const std::string& swap_folder() const;
  /// The file of tensor `name` of sub-group `id`: <swap_folder>/<id>_<name>.tensor.swp
  std::string swap_path(int id, const std::string& name) const;

  int64_t swapped_bytes() const;   // buffer bytes of the swappable sub-groups (4 KiB-aligned)
  int64_t resident_bytes() const;  // bytes of the sub-groups kept in memory
  int64_t buffer_bytes() const;    // bytes of the aligned buffers allocated so far
  /// Transfers done so far (tests and logs see read-ahead and write-behind through these).
  int64_t reads() const;
  int64_t writes() const;
  /// Tensor writes started and not yet settled (write-behind in progress).
  int64_t writes_in_flight() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepspeed::runtime::swap

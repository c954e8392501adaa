// ShardSwapper: ZeRO-Infinity's parameter swapping (DeepSpeed's
// runtime/swap_tensor/partitioned_param_swapper.py). Each registered tensor is one parameter's
// shard (this rank's 1/W of it, 1-D, in the model dtype); between uses it lives in
// <nvme_path>/zero_stage_3/<dtype>params/rank<R>/<id>_param.tensor.swp and in no memory. For an
// all-gather it is read into one of `buffer_count` aligned buffers and the caller's tensor is
// re-pointed (set_data) at it; release() lets the buffer go again. An updated shard (after an
// optimizer step) is written straight to its file.
//
// offload_param.max_in_cpu: shards are kept in host memory, never swapped, in registration
// order while their running total stays within max_in_cpu elements (DeepSpeed: "number of
// parameter elements to maintain in CPU memory"). Buffers hold buffer_size elements each (no
// shard may be larger), or less when all swapped shards fit in less. Unlike DeepSpeed, which
// gives each shard a buffer of its own, shards are packed end to end (4 KiB-aligned) into the
// buffers, so a unit of many small parameters does not need as many buffers as parameters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/aio.h"

namespace deepspeed::runtime::swap {

struct ShardSwapperOptions {
  std::string nvme_path;             // offload_param.nvme_path
  int rank = 0;
  at::ScalarType dtype = at::kFloat;  // names the folder: float32params, bfloat16params, ...
  int64_t buffer_count = 5;           // offload_param.buffer_count
  int64_t buffer_size = 100000000;    // offload_param.buffer_size (elements)
  int64_t max_in_cpu = 1000000000;    // offload_param.max_in_cpu (elements)
  aio::AioOptions aio;
};

class ShardSwapper {
 public:
  /// Creates the swap folder (aio::AioError naming it when it cannot).
  explicit ShardSwapper(ShardSwapperOptions options);
  /// Waits for transfers in flight and removes the files it wrote.
  ~ShardSwapper();
  ShardSwapper(const ShardSwapper&) = delete;
  ShardSwapper& operator=(const ShardSwapper&) = delete;

  /// Registers `shard` (a contiguous 1-D CPU tensor of `dtype`; the handle is kept) with its
  /// current values. Unless max_in_cpu keeps it, writes it out and frees its memory. Returns
  /// its id. ConfigError naming offload_param.buffer_size for a shard larger than buffer_size.
  int add(const at::Tensor& shard);

  /// Starts reading these swapped shards into free buffers (as many as are free).
  void prefetch(const std::vector<int>& ids);
  /// Afterwards each shard holds its values in memory (reads in flight are waited for).
  /// ConfigError naming offload_param.buffer_count and buffer_size when the buffers cannot hold
  /// them all next to the shards held now.
  void swap_in(const std::vector<int>& ids);
  /// Frees the in-memory copies (nothing is written: the file holds the same values). Shards
  /// that are not in memory are skipped.
  void release(const std::vector<int>& ids);
  /// Replaces shard `id`'s values (`values`: `numel` elements, converted to `dtype`): written
  /// to its file now (or copied in, for one kept in memory).
  void write(int id, const at::Tensor& values);

  bool swapped(int id) const;    // false for shards max_in_cpu keeps in memory
  bool in_memory(int id) const;  // kept, or swapped in now
  std::string swap_path(int id) const;
  const std::string& swap_folder() const;
  int64_t swapped_bytes() const;   // bytes in swap files
  int64_t resident_bytes() const;  // bytes of the shards kept in memory
  int64_t buffer_bytes() const;    // bytes of the buffers allocated so far
  int64_t reads() const;
  int64_t writes() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepspeed::runtime::swap

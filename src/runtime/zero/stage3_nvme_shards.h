// NvmeShardStore: offload_param.device "nvme" for ZeRO-3 (ZeRO-Infinity's parameter side). The
// trainable, non-persistent parameters' shards are registered with a swap::ShardSwapper, which
// writes them to <nvme_path>/zero_stage_3/... and frees them (offload_param.max_in_cpu keeps
// the first ones in host memory instead). The ParamCoordinator reads a shard in for its
// all-gather and drops it after (ShardStore); the optimizer step writes each updated shard
// straight to its file (write()).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/swap/shard_swapper.h"
#include "runtime/zero/stage3_param.h"
#include "runtime/zero/stage3_shard_store.h"

namespace deepspeed::runtime {

class NvmeShardStore final : public ShardStore {
 public:
  NvmeShardStore(std::vector<PartitionedParam>* params, swap::ShardSwapperOptions options);

  /// Registers parameter `param`'s shard (its current values).
  void add(size_t param);
  bool registered(size_t param) const;

  bool swapped(size_t param) const override;
  void prefetch(const std::vector<size_t>& params) override;
  void swap_in(const std::vector<size_t>& params) override;
  void release(const std::vector<size_t>& params) override;

  /// The shard's new values (model dtype, its shard_numel elements) after an optimizer step.
  void write(size_t param, const at::Tensor& values);

  int64_t swapped_bytes() const;  // in swap files
  int64_t buffer_bytes() const;   // swap buffers allocated
  const swap::ShardSwapper& swapper() const { return *swapper_; }

 private:
  std::vector<int> ids(const std::vector<size_t>& params) const;

  std::vector<PartitionedParam>* params_;
  std::unique_ptr<swap::ShardSwapper> swapper_;
  std::vector<int> id_of_;  // swapper id per parameter, -1 when not registered
};

}  // namespace deepspeed::runtime

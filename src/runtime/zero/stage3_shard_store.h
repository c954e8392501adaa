// ShardStore: where ZeRO-3 parameter shards live while nobody needs them, when that is not
// memory (offload_param.device "nvme", ZeRO-Infinity). The ParamCoordinator brings a shard in
// before the all-gather that reads it and lets it go once that all-gather is done; its
// prefetch turns into read-ahead of the shards the next units will gather. Parameters the store
// does not hold (persistent, frozen, or kept in host memory by offload_param.max_in_cpu) have
// their shard in memory all the time.
#pragma once

#include <cstddef>
#include <vector>

namespace deepspeed::runtime {

class ShardStore {
 public:
  virtual ~ShardStore() = default;
  /// Whether parameter `param`'s shard is swapped (read in on demand).
  virtual bool swapped(size_t param) const = 0;
  /// Starts reading these shards, as far as buffers allow (best effort).
  virtual void prefetch(const std::vector<size_t>& params) = 0;
  /// Afterwards each parameter's `shard` holds its values (waits for reads in flight).
  virtual void swap_in(const std::vector<size_t>& params) = 0;
  /// The shards are no longer needed in memory (unchanged: nothing is written).
  virtual void release(const std::vector<size_t>& params) = 0;
};

}  // namespace deepspeed::runtime

// Partitioned parameters for the gather tests of ZeRO-3's quantized paths: each released (its
// full tensor's storage freed, as after a unit's forward) and holding this rank's shard.
#pragma once

#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "runtime/zero/stage3_param.h"

namespace deepspeed::testing {

/// Rank r's shard of parameter i among parameters of `sizes` over `world` ranks: seeded by
/// (i, r), scaled by i + 1 so that the parameters' ranges differ.
inline at::Tensor random_shard(const std::vector<int64_t>& sizes, size_t i, int r, int world) {
  torch::manual_seed(static_cast<int64_t>(100 * i) + r);
  return torch::randn({runtime::shard_numel_for(sizes[i], world)}) * static_cast<double>(i + 1);
}

/// Released parameters of `sizes` elements, each holding `rank`'s random_shard.
inline std::vector<runtime::PartitionedParam> released_params(const std::vector<int64_t>& sizes,
                                                              int rank, int world) {
  std::vector<runtime::PartitionedParam> params(sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    runtime::PartitionedParam& p = params[i];
    p.param = torch::zeros({sizes[i]});
    runtime::ensure_own_storage(p.param);
    runtime::free_storage(p.param);
    p.numel = sizes[i];
    p.shard_numel = runtime::shard_numel_for(sizes[i], world);
    p.shard = random_shard(sizes, i, rank, world);
  }
  return params;
}

/// Pointers to `params`, as start_gathers takes them.
inline std::vector<runtime::PartitionedParam*> pointers_to(
    std::vector<runtime::PartitionedParam>& params) {
  std::vector<runtime::PartitionedParam*> out;
  for (auto& p : params) out.push_back(&p);
  return out;
}

}  // namespace deepspeed::testing

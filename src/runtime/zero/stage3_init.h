// The parameters zero::Init partitioned before an engine existed (deepspeed/zero3.h): for each,
// this rank's shard and the world size it was cut for. The stage-3 engine takes them over.
#pragma once

#include <optional>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

struct PrePartitioned {
  at::Tensor shard;  // ceil(numel / world) elements, model dtype
  int world = 1;
};

/// Removes and returns the shard zero::Init kept for `param` (nullopt if it was not partitioned).
std::optional<PrePartitioned> take_pre_partitioned(const at::Tensor& param);
/// Whether zero::Init partitioned `param` and no engine took it over yet.
bool is_pre_partitioned(const at::Tensor& param);

}  // namespace deepspeed::runtime

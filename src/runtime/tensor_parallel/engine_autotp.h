// What the engine does for tensor parallelism (DeepSpeed's AutoTP training and its `mpu`
// contract): picks the tensor-parallel group, shards the module at initialize when
// tensor_parallel.autotp_size > 1, and applies DeepSpeed's gradient-norm rule to the ZeRO stage.
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/mpu.h"

namespace torch::nn {
class Module;
}

namespace deepspeed::runtime {

class ZeroOptimizer;

/// tensor_parallel.autotp_size of a loaded config (0 or 1: AutoTP off).
int autotp_size(const DeepSpeedConfig& c);

/// The mpu an AutoTP engine runs with: `mpu` when given (its tensor-parallel group must have
/// autotp_size ranks), else a TopologyMpu over groups of autotp_size consecutive ranks (as
/// DeepSpeed builds them), made here collectively. `mpu` unchanged when AutoTP is off.
std::shared_ptr<Mpu> autotp_mpu(const DeepSpeedConfig& c, std::shared_ptr<Mpu> mpu);

/// The tensor-parallel group of an mpu: the model axis of a TopologyMpu or of a pipeline's mpu,
/// else its model-parallel group.
comm::Group tensor_parallel_group(const Mpu& mpu);

/// AutoTP at initialize: shards `module` over the mpu's tensor-parallel group (ZeRO-3 refused,
/// as DeepSpeed) and logs the plan. No-op when autotp_size <= 1.
void apply_autotp(const DeepSpeedConfig& c, torch::nn::Module& module, const Mpu& mpu);

/// The group of the tensor-parallel parameters among `params`; nullopt when none is marked.
/// Throws UsageError when they name different groups.
std::optional<comm::Group> tensor_parallel_group_of(const std::vector<at::Tensor>& params);

/// DeepSpeed's norm rule (reference 5.6): every rank counts its tensor-parallel shards; a
/// replicated parameter counts on its tensor-parallel group's first rank only. Tells `zero`
/// which parameters to leave out on this rank. No-op without tensor-parallel parameters.
void exclude_replicated_from_norm(ZeroOptimizer& zero, const std::vector<at::Tensor>& params);

}  // namespace deepspeed::runtime

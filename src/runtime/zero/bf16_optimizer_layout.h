// DeepSpeed's BF16_Optimizer: the wrapper it trains bf16 with under pipeline parallelism (ZeRO
// stage 0, gradients accumulated in bf16) and at ZeRO stage 1 with fp32 gradient accumulation
// (data_types.grad_accum_dtype "fp32", no offload). Like ZeRO-1 it partitions each flat param
// group over the data-parallel ranks (alignment 2 x W elements, the padding on the last rank),
// and each rank saves bf16_zero_pp_rank_<d>_mp_rank_<m>_optim_states.pt; its state_dict has no
// zero_stage or loss scaler and stores each partition with its padding
// (checkpoint::ZeroOptimizerStates::bf16_optimizer). At stage 0 the model states' 'optimizer'
// also holds data-parallel rank 0's state_dict.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/config.h"

namespace deepspeed::runtime {

/// Whether DeepSpeed trains this ZeRO-1 config with BF16_Optimizer (bf16, fp32 gradient
/// accumulation, no offload). Under pipeline parallelism the engine only reads its layout: it
/// keeps the 16-bit stage-0 one there (FlatZeroOptimizer::read_bf16_optimizer_files).
bool zero1_uses_bf16_optimizer(const DeepSpeedConfig& config);

/// BF16_Optimizer's partitions as ZeRO-1 stores them: each group's `group_paddings[g]` tail
/// elements dropped (views; a group without a padding entry as it is).
void drop_bf16_optimizer_padding(std::vector<at::Tensor>* partitions,
                                 const std::vector<int64_t>& group_paddings);

}  // namespace deepspeed::runtime

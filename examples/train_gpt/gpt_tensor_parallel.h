// train_gpt --tensor_parallel_size T: the process groups (pipe x model x data, Megatron's
// placement: the T ranks of a tensor-parallel group are adjacent) and the AutoTP request, with
// the GPT's own shape checks (AutoTP cannot know the head count).
#pragma once

#include <memory>

#include "deepspeed/config.h"
#include "deepspeed/mpu.h"
#include "deepspeed/topology.h"
#include "gpt_model.h"

namespace deepspeed::examples {

/// Throws ConfigError naming the sizes when n_embd or n_head is not divisible by `tp`.
void check_gpt_tensor_parallel(const GptConfig& cfg, int tp);

/// The topology of a job of `pipe` stages x `tp` tensor-parallel ranks x world / (pipe * tp)
/// data-parallel replicas; ConfigError when that does not divide the world size.
ProcessTopology gpt_parallel_topology(int pipe, int tp);
/// Its mpu (collective: makes the groups).
std::shared_ptr<TopologyMpu> gpt_parallel_mpu(int pipe, int tp);

/// Sets the config's tensor_parallel.autotp_size to `tp` (the engine then shards the GPT's
/// attention and MLP); ConfigError when the config asks for another size.
void request_autotp(DeepSpeedConfig* config, int tp);

}  // namespace deepspeed::examples

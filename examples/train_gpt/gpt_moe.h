// train_gpt's Mixture of Experts: every `every`-th block's MLP becomes a deepspeed::moe::MoE of
// `num_experts` copies of it (Megatron-DeepSpeed's --num-experts / --expert-interval), and the
// loss gets aux_loss_coef x the layers' load-balancing losses. See docs/moe.md.
#pragma once

#include <cstdint>

#include "deepspeed/moe.h"

namespace CLI {
class App;
}

namespace deepspeed::examples {

struct GptMoeConfig {
  int64_t num_experts = 0;       // --moe_num_experts: 0 or 1 keeps the dense MLPs
  int64_t ep_size = 1;           // --moe_ep_size: ranks each MoE layer's experts spread over
  int64_t top_k = 1;             // --moe_top_k: 1 or 2
  int64_t every = 1;             // --moe_every: blocks N-1, 2N-1, ... (1-based multiples of N)
  double capacity_factor = 1.0;  // --moe_capacity_factor (eval uses the same)
  bool drop_tokens = true;       // --moe_drop_tokens
  double aux_loss_coef = 0.01;   // --moe_aux_loss_coef: weight of the summed l_aux in the loss
  int64_t min_capacity = 4;      // Megatron-DeepSpeed's --moe-min-capacity default

  bool enabled() const { return num_experts > 1; }
  /// Whether block `index` (0-based) of the model is an MoE block.
  bool is_moe_block(int64_t index) const { return enabled() && (index + 1) % every == 0; }
  moe::MoEOptions layer_options() const;
};

/// Registers the --moe_* flags.
void add_moe_flags(CLI::App& app, GptMoeConfig& config);

}  // namespace deepspeed::examples

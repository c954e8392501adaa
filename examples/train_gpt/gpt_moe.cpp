// See gpt_moe.h.
#include "gpt_moe.h"

#include <CLI/CLI.hpp>

#include "util/cli_checks.h"

namespace deepspeed::examples {

moe::MoEOptions GptMoeConfig::layer_options() const {
  moe::MoEOptions o;
  o.num_experts = num_experts;
  o.ep_size = ep_size;
  o.k = top_k;
  o.capacity_factor = capacity_factor;
  o.eval_capacity_factor = capacity_factor;
  o.min_capacity = min_capacity;
  o.drop_tokens = drop_tokens;
  return o;
}

void add_moe_flags(CLI::App& app, GptMoeConfig& c) {
  app.add_option("--moe_num_experts", c.num_experts,
                 "experts per MoE layer (> 1 turns MoE on; docs/moe.md)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--moe_ep_size", c.ep_size, "expert-parallel size (divides the world size)")
      ->capture_default_str()
      ->check(deepspeed::util::at_least_one());
  app.add_option("--moe_top_k", c.top_k, "top-1 or top-2 gating")
      ->capture_default_str()
      ->check(CLI::Range(1, 2));
  app.add_option("--moe_every", c.every, "every N-th block's MLP is an MoE layer")
      ->capture_default_str()
      ->check(deepspeed::util::at_least_one());
  app.add_option("--moe_capacity_factor", c.capacity_factor, "expert capacity factor")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--moe_drop_tokens", c.drop_tokens,
                 "drop tokens beyond an expert's capacity (true|false)")
      ->capture_default_str();
  app.add_option("--moe_aux_loss_coef", c.aux_loss_coef,
                 "weight of the load-balancing loss added to the LM loss")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
}

}  // namespace deepspeed::examples

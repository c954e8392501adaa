// deepspeed::moe's token-choice MoE block and AutoEP (DeepSpeed 0.19.8's `expert_parallel`
// section). TokenChoiceMoE is the sparse MoE block of Mixtral, Qwen3-MoE and DeepSeek: a router
// scores every token against every expert and sends it to its top-k experts, with no capacity
// and no dropped token; the block returns the score-weighted sum of their SwiGLU outputs. A
// model is written with whole layers (every expert on every rank). With `expert_parallel`
// enabled, deepspeed::initialize shards each layer's experts over `autoep_size` ranks, as
// DeepSpeed's AutoEP replaces a Hugging Face MoE block by its AutoEPMoELayer: rank r of an
// expert-parallel group keeps experts [r * E / ep, (r + 1) * E / ep), tokens travel to their
// experts and back by all-to-all with per-rank sizes, and the engine reduces expert gradients
// over the expert-data-parallel group. See docs/moe.md.
//
//   moe::TokenChoiceOptions o;  o.num_experts = 8;  o.top_k = 2;
//   auto block = moe::TokenChoiceMoE(hidden, ffn, o);   // block->forward(x): [..., hidden]
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "deepspeed/moe.h"

namespace deepspeed::moe {

/// The routing of DeepSpeed's TokenChoiceTopKRouter (deepspeed/moe/ep_router.py).
struct TokenChoiceOptions {
  int64_t num_experts = 8;
  int64_t top_k = 2;
  std::string score_func = "softmax";  // or "sigmoid"; taken in fp32 over the gate's logits
  std::string score_apply = "post";    // "post": scale each expert's output; "pre": its input
  bool route_norm = true;              // divide the k scores by their sum (+1e-20)
  double route_scale = 1.0;            // then multiply them by this
  /// Group-limited routing (DeepSeek's, DeepSpeed's node-limited routing): the experts in
  /// num_expert_groups groups of consecutive ones, each group scored by its best score ("max",
  /// DeepSeek-V2) or the sum of its two best ("top2_sum", DeepSeek-V3), and a token's k experts
  /// chosen within its num_limited_groups best groups only. 0: every expert is a candidate.
  int64_t num_expert_groups = 0;
  int64_t num_limited_groups = 0;
  std::string group_score_func = "top2_sum";
  /// DeepSeek-V3's e_score_correction_bias (its "noaux_tc" routing): a [num_experts] buffer,
  /// registered on the gate as transformers' DeepseekV3TopkRouter has it, added to the scores
  /// that choose the experts (and their groups) but not to the weights.
  bool score_correction_bias = false;
};

/// The experts' weights, stacked as DeepSpeed's GroupedExperts keeps them:
/// w1 (gate) and w3 (up) [E, ffn, hidden], w2 (down) [E, hidden, ffn]; expert e computes
/// w2[e] (silu(w1[e] x) * w3[e] x).
class GroupedExpertsImpl : public torch::nn::Module {
 public:
  GroupedExpertsImpl(int64_t num_experts, int64_t hidden, int64_t ffn);
  /// rows [N, hidden] sorted by expert, counts[e] of them for local expert e -> [N, hidden].
  /// Every expert runs, on zero rows if it got none, so each weight has a gradient.
  at::Tensor forward(const at::Tensor& rows, const std::vector<int64_t>& counts);

  at::Tensor w1, w2, w3;
};
TORCH_MODULE(GroupedExperts);

class TokenChoiceMoEImpl : public torch::nn::Module {
 public:
  TokenChoiceMoEImpl(int64_t hidden, int64_t ffn, TokenChoiceOptions options);
  /// x [..., hidden] -> [..., hidden]. Collective over the expert-parallel group once sharded.
  at::Tensor forward(const at::Tensor& x);

  /// AutoEP: keeps this rank's experts of `groups` (which must divide num_experts) and routes
  /// through its expert-parallel group from then on. The full weights must be the same on every
  /// rank of the group (the engine broadcasts them first). Once only.
  void shard_experts(const ExpertGroups* groups);

  const TokenChoiceOptions& options() const { return options_; }
  /// Routing settings may change until the first forward (AutoEP's overrides).
  TokenChoiceOptions& mutable_options() { return options_; }
  int64_t num_experts() const { return options_.num_experts; }
  int64_t num_local_experts() const { return experts->w1.size(0); }
  int64_t ep_size() const { return groups_ ? groups_->ep_size : 1; }
  /// The global id of this rank's first expert.
  int64_t first_expert() const;
  const ExpertGroups* ep_groups() const { return groups_; }
  std::vector<at::Tensor> expert_parameters() const;
  /// Tokens routed to each of the num_experts experts by the last forward (this rank's).
  const at::Tensor& tokens_per_expert() const { return tokens_per_expert_; }
  /// Keeps the gate's logits of each forward (fp32 [tokens, num_experts], in the autograd
  /// graph) for a loss taken from them, such as transformers' load-balancing loss. Off by
  /// default: kept logits hold their graph until the next forward.
  void set_keep_router_logits(bool on) { keep_router_logits_ = on; }
  /// The last forward's logits while kept; undefined otherwise.
  const at::Tensor& router_logits() const { return router_logits_; }

  torch::nn::Linear gate{nullptr};  // [num_experts, hidden], no bias
  GroupedExperts experts{nullptr};
  /// gate.e_score_correction_bias with TokenChoiceOptions::score_correction_bias, else undefined.
  at::Tensor score_correction_bias;

 private:
  TokenChoiceOptions options_;
  const ExpertGroups* groups_ = nullptr;
  at::Tensor tokens_per_expert_;
  bool keep_router_logits_ = false;
  at::Tensor router_logits_;
};
TORCH_MODULE(TokenChoiceMoE);

/// Every TokenChoiceMoE of `module` with its qualified name, in named_modules order.
std::vector<std::pair<std::string, std::shared_ptr<TokenChoiceMoEImpl>>> token_choice_layers(
    torch::nn::Module& module);

}  // namespace deepspeed::moe

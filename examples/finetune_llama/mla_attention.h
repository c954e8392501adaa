// DeepSeek-V2's and V3's multi-head latent attention (transformers' DeepseekV3Attention, same
// parameter names): keys and values come from one kv_lora_rank-wide latent per position
// (kv_a_proj_with_mqa, normalised by kv_a_layernorm, expanded per head by kv_b_proj), plus one
// rotated key part every head shares; queries through the q_lora_rank bottleneck (q_a_proj,
// q_a_layernorm, q_b_proj) or one q_proj. The KV cache keeps the latents and the rotated shared
// keys, not the expanded heads: that is MLA's point.
#pragma once

#include <cstdint>
#include <string>

#include <torch/nn/module.h>

#include "deepspeed/linear.h"
#include "llama_config.h"
#include "llama_model.h"

namespace deepspeed::examples {

class MultiLatentAttentionImpl : public torch::nn::Module {
 public:
  /// `prefix`: the module's qualified name with a trailing dot, for cfg.lora's target_mods.
  explicit MultiLatentAttentionImpl(const LlamaConfig& cfg, const std::string& prefix = "");
  /// x [B, T, hidden]; cos/sin [T, qk_rope_head_dim] for the positions of x; `past_latent`
  /// [B, 1, T_past, kv_lora_rank] and `past_rope` [B, 1, T_past, qk_rope_head_dim] (may be null)
  /// this layer's cache, extended in place.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        torch::Tensor* past_latent, torch::Tensor* past_rope);

  linear::OptimizedLinear q_proj{nullptr};  // without a q bottleneck
  linear::OptimizedLinear q_a_proj{nullptr}, q_b_proj{nullptr};
  RmsNorm q_a_layernorm{nullptr};
  linear::OptimizedLinear kv_a_proj_with_mqa{nullptr}, kv_b_proj{nullptr}, o_proj{nullptr};
  RmsNorm kv_a_layernorm{nullptr};

 private:
  int64_t n_head_, nope_, rope_, v_head_, rank_;
  bool interleaved_;  // the rotated features in adjacent pairs (x0, x1), (x2, x3), ...
  double scaling_;    // qk_head_dim^-1/2, times yarn's mscale(factor, mscale_all_dim)^2
};
TORCH_MODULE(MultiLatentAttention);

}  // namespace deepspeed::examples

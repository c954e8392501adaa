// Multi-head latent attention (see mla_attention.h), in transformers 5.15's DeepseekV3Attention
// operation order (eager attention).
#include "mla_attention.h"

#include <cmath>

#include <torch/torch.h>

#include "decoder_ops.h"

namespace deepspeed::examples {
namespace {

// DeepSeek's softmax scale: yarn stretches it by mscale(factor, mscale_all_dim)^2 with
// mscale(s, m) = 0.1 m ln(s) + 1 (1 for s <= 1), as transformers' yarn_apply_mscale.
double latent_attention_scaling(const LlamaConfig& cfg) {
  double scaling = 1.0 / std::sqrt(static_cast<double>(cfg.qk_head_dim()));
  const RopeScaling& r = cfg.rope_scaling;
  if (!r.is_default() && r.mscale_all_dim.value_or(0.0) != 0.0 && r.factor > 1.0) {
    const double m = 0.1 * *r.mscale_all_dim * std::log(r.factor) + 1.0;
    scaling = scaling * m * m;
  }
  return scaling;
}

// Features in adjacent pairs -> the halves rotate_half turns: (x0, x2, ...; x1, x3, ...). Applied
// to queries and keys alike, so their products are unchanged; the result is what DeepSeek's
// complex (V2) or interleaved (V3) rotation gives.
torch::Tensor deinterleave(const torch::Tensor& x) {
  return torch::cat({x.slice(-1, 0, x.size(-1), 2), x.slice(-1, 1, x.size(-1), 2)}, -1);
}

}  // namespace

MultiLatentAttentionImpl::MultiLatentAttentionImpl(const LlamaConfig& cfg,
                                                   const std::string& prefix)
    : n_head_(cfg.num_attention_heads),
      nope_(cfg.qk_nope_head_dim),
      rope_(cfg.head_dim),
      v_head_(cfg.v_head_dim),
      rank_(cfg.kv_lora_rank),
      interleaved_(cfg.rope_interleave),
      scaling_(latent_attention_scaling(cfg)) {
  const int64_t hidden = cfg.hidden_size, q_out = n_head_ * cfg.qk_head_dim();
  const bool bias = cfg.attention_bias;
  const auto proj = [&](const char* name, int64_t in, int64_t out, bool with_bias) {
    return register_module(name, decoder_projection(cfg, prefix + name, in, out, with_bias));
  };
  // The bottleneck's norms take RMSNorm's default epsilon (1e-6), not rms_norm_eps.
  if (cfg.q_lora_rank > 0) {
    q_a_proj = proj("q_a_proj", hidden, cfg.q_lora_rank, bias);
    q_a_layernorm = register_module("q_a_layernorm", RmsNorm(cfg.q_lora_rank, 1e-6));
    q_b_proj = proj("q_b_proj", cfg.q_lora_rank, q_out, false);
  } else {
    q_proj = proj("q_proj", hidden, q_out, false);
  }
  kv_a_proj_with_mqa = proj("kv_a_proj_with_mqa", hidden, rank_ + rope_, bias);
  kv_a_layernorm = register_module("kv_a_layernorm", RmsNorm(rank_, 1e-6));
  kv_b_proj = proj("kv_b_proj", rank_, n_head_ * (nope_ + v_head_), false);
  o_proj = proj("o_proj", n_head_ * v_head_, hidden, bias);
}

torch::Tensor MultiLatentAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                                const torch::Tensor& sin,
                                                torch::Tensor* past_latent,
                                                torch::Tensor* past_rope) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj ? q_proj(x) : q_b_proj(q_a_layernorm(q_a_proj(x)));
  q = q.view({B, T, n_head_, nope_ + rope_}).transpose(1, 2);  // [B, H, T, qk]
  auto q_pass = q.slice(-1, 0, nope_), q_rot = q.slice(-1, nope_);
  const auto compressed = kv_a_proj_with_mqa(x);
  auto latent = kv_a_layernorm(compressed.slice(-1, 0, rank_)).view({B, 1, T, rank_});
  auto k_rot = compressed.slice(-1, rank_).view({B, 1, T, rope_});
  if (interleaved_) {
    q_rot = deinterleave(q_rot);
    k_rot = deinterleave(k_rot);
  }
  const auto c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  q_rot = rotate(q_rot, c, s);
  k_rot = rotate(k_rot, c, s);
  if (past_latent != nullptr) {
    if (past_latent->defined()) {
      latent = torch::cat({*past_latent, latent}, 2);
      k_rot = torch::cat({*past_rope, k_rot}, 2);
    }
    *past_latent = latent;
    *past_rope = k_rot;
  }
  const int64_t S = latent.size(2);
  // Each head's unrotated key and value from the latents of every position seen.
  const auto kv =
      kv_b_proj(latent.squeeze(1)).view({B, S, n_head_, nope_ + v_head_}).transpose(1, 2);
  const auto k = torch::cat({kv.slice(-1, 0, nope_), k_rot.expand({B, n_head_, S, rope_})}, -1);
  const auto v = kv.slice(-1, nope_);
  const auto y = causal_attention(torch::cat({q_pass, q_rot}, -1), k, v, scaling_);
  return o_proj(y.transpose(1, 2).reshape({B, T, n_head_ * v_head_}));
}

}  // namespace deepspeed::examples

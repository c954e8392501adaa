// The arithmetic the attention variants of finetune_llama's decoder share (llama_model.h's
// grouped-query attention, mla_attention.h's multi-head latent attention): the projections
// (LoRA-aware), the rotary embedding and the causal softmax attention, each as transformers'
// eager path computes it.
#pragma once

#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>

#include "deepspeed/linear.h"
#include "llama_config.h"

namespace deepspeed::examples {

/// A decoder projection: with LoRA adapters when cfg.lora targets `name` (DeepSpeed's rule: the
/// name contains one of target_mods), a plain Linear otherwise.
linear::OptimizedLinear decoder_projection(const LlamaConfig& cfg, const std::string& name,
                                           int64_t in, int64_t out, bool bias);

/// The rotary embedding of x [..., head] by cos/sin [T, rotary] (rotate-half form): a partial
/// rotation (Phi-4-mini's, rotary < head) turns the first `rotary` features and passes the rest.
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

/// Scaled-dot-product attention of q [B, H, T, d] over k [B, H, S, d] and v [B, H, S, dv], the
/// last T of the S positions being the queries' own (S - T of them cached): the scores times
/// `scaling`, soft-capped at `softcap` when positive (Gemma 2), causally masked (and to the last
/// `sliding_window` keys when positive), softmax in fp32 -> [B, H, T, dv] in q's dtype.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scaling, int64_t sliding_window = -1, double softcap = 0.0);

}  // namespace deepspeed::examples

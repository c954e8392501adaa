// Causal scaled-dot-product attention that takes the fastest exact path the LibTorch build has.
#pragma once

#include <ATen/core/Tensor.h>

namespace deepspeed::nn {

/// softmax(q k^T / sqrt(head_dim) + causal mask) v over [B, heads, T, head_dim] tensors, with
/// dropout `dropout_p` on the attention weights when `training`.
/// On CUDA with LibTorch 2.x: at::scaled_dot_product_attention (flash / memory-efficient
/// kernels, never materializing the T x T scores). Elsewhere: the explicit formula, so that CPU
/// results stay bit-identical to earlier releases and to Python's reference models.
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout_p, bool training);

}  // namespace deepspeed::nn

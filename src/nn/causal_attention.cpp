// See deepspeed/causal_attention.h.
#include "deepspeed/causal_attention.h"

#include <cmath>
#include <limits>

#include <ATen/ATen.h>

#include "util/torch_compat.h"

namespace deepspeed::nn {

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double dropout_p, bool training) {
  const double p = training ? dropout_p : 0.0;
#if DS_HAS_FUSED_SDPA
  if (q.is_cuda()) return at::scaled_dot_product_attention(q, k, v, {}, p, /*is_causal=*/true);
#endif
  const int64_t T = q.size(-2), S = k.size(-2);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  at::Tensor att = at::matmul(q, k.transpose(-2, -1)) * scale;
  const at::Tensor future = at::ones({T, S}, q.options().dtype(at::kBool)).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
  att = at::softmax(att, -1);
  if (p > 0.0) att = at::dropout(att, p, /*train=*/true);
  return at::matmul(att, v);
}

}  // namespace deepspeed::nn

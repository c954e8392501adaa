// The 1-bit optimizers' momentum mask (see the header).
#include "runtime/optim/onebit/momentum_mask.h"

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::onebit {

// Note [Momentum mask]
// 1-bit compression cannot send an exact zero: after the compressed all-reduce every element of
// a momentum is +-scale, also where the true average is 0. An element whose frozen variance is
// (nearly) 0 then steps by scale / (sqrt(v) + eps), far more than Adam's ~lr. DeepSpeed's answer
// is the param-group key exp_avg_mask, multiplied into the momentum right after each compressed
// all-reduce (onebit/adam.py, zoadam.py, lamb.py); its BERT example masks the position
// embeddings beyond the trained sequence length. A group with a mask gets exactly that. A group
// without one gets the mask (exp_avg_sq != 0): DeepSpeed has no such default, but an element
// whose variance is exactly 0 never had a gradient in the warm-up, and DeepSpeed would step it
// by scale / eps (1e8 x scale), so this only differs from DeepSpeed where DeepSpeed breaks.

void CompressedCommunication::set_exp_avg_mask(size_t group, at::Tensor mask) {
  if (exp_avg_masks_.size() <= group) exp_avg_masks_.resize(group + 1);
  if (mask.defined()) {
    DS_CHECK(mask.is_floating_point() || mask.scalar_type() == at::kBool, UsageError,
             "exp_avg_mask of param group ", group, " must be a floating-point or bool tensor "
             "(got ", mask.scalar_type(), ")");
    mask = mask.detach().to(at::kFloat).contiguous();
  }
  exp_avg_masks_[group] = std::move(mask);
}

at::Tensor CompressedCommunication::exp_avg_mask(size_t group) const {
  return group < exp_avg_masks_.size() ? exp_avg_masks_[group] : at::Tensor();
}

size_t group_index(optim::DsOptimizer& optimizer, const optim::GroupOptions& group) {
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    if (&optimizer.group_options(g) == &group) return g;
  }
  DS_INTERNAL_ASSERT(false, "GroupOptions of another optimizer");
  return 0;
}

void mask_momentum(at::Tensor& momentum, const at::Tensor& mask, const at::Tensor& exp_avg_sq) {
  if (!mask.defined()) {
    momentum.mul_(exp_avg_sq.ne(0));
    return;
  }
  DS_CHECK(mask.numel() == momentum.numel(), UsageError, "exp_avg_mask has ", mask.numel(),
           " elements but the momentum it masks has ", momentum.numel(), " (shape ",
           momentum.sizes(), "); give each masked parameter a param group of its own");
  momentum.mul_(mask.to(momentum.device()).view(momentum.sizes()));
}

}  // namespace deepspeed::onebit

// Vocab-parallel cross-entropy (Megatron's cross_entropy.py), built from the region functions:
// log(sum over every rank of exp(logit - max)) - (target logit - max), where each rank holds
// only its vocabulary columns. The gradient follows from autograd: softmax - one-hot, on the
// local columns only.
#include <limits>

#include <torch/torch.h>

#include "deepspeed/tensor_parallel.h"
#include "util/check.h"

namespace deepspeed::tensor_parallel {

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets,
                                        const comm::Group& group, int64_t vocab_start,
                                        int64_t vocab_size) {
  const int64_t local = logits.size(-1);
  DS_CHECK(targets.sizes() == logits.sizes().slice(0, logits.dim() - 1), UsageError,
           "tensor_parallel::vocab_parallel_cross_entropy: targets ", targets.sizes(),
           " do not match the logits ", logits.sizes(), " without their last dimension");
  if (targets.numel() > 0) {
    const int64_t max_target = targets.max().item<int64_t>();
    const int64_t min_target = targets.min().item<int64_t>();
    DS_CHECK(min_target >= 0 && max_target < vocab_size, UsageError,
             "tensor_parallel::vocab_parallel_cross_entropy: target ids must lie in [0, ",
             vocab_size, ") (the unpadded vocabulary); got [", min_target, ", ", max_target, "]");
  }
  // The padding columns (global index >= vocab_size) are left out of the softmax.
  at::Tensor lg = logits;
  const int64_t valid = std::max<int64_t>(0, std::min(local, vocab_size - vocab_start));
  if (valid < local) {
    at::Tensor pad = at::arange(local, targets.options()) >= valid;
    lg = lg.masked_fill(pad, -std::numeric_limits<double>::infinity());
  }
  // The shift by the global maximum only keeps exp() in range; it cancels out of the loss, so it
  // carries no gradient.
  at::Tensor max;
  {
    torch::NoGradGuard no_grad;
    max = lg.amax(-1, /*keepdim=*/true).contiguous();
    if (group.size() > 1) comm::all_reduce(max, comm::ReduceOp::kMax, false, group);
  }
  at::Tensor shifted = lg - max;
  at::Tensor sum_exp = reduce_from_model_parallel_region(shifted.exp().sum(-1), group);
  at::Tensor t_local = targets - vocab_start;
  at::Tensor outside = (t_local < 0).logical_or(t_local >= local);
  at::Tensor index = t_local.masked_fill(outside, 0).unsqueeze(-1);
  at::Tensor target_logit = shifted.gather(-1, index).squeeze(-1).masked_fill(outside, 0.0);
  target_logit = reduce_from_model_parallel_region(target_logit, group);
  return sum_exp.log() - target_logit;
}

}  // namespace deepspeed::tensor_parallel

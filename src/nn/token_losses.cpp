// See token_losses.h.
#include "nn/token_losses.h"

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::nn {

void check_class_targets(const at::Tensor& target, int64_t vocab, int64_t ignore_index,
                         const char* who) {
  DS_CHECK(target.scalar_type() == at::kLong, UsageError, who,
           ": targets must be int64 class indices, got ", target.scalar_type());
  if (target.numel() == 0) return;
  const at::Tensor counted = target.ne(ignore_index);
  const at::Tensor out_of_range = counted.logical_and(target.lt(0).logical_or(target.ge(vocab)));
  if (!target.is_cpu()) {
    // An out-of-range target would read another row's logit; fail on the device, as
    // cross_entropy does, rather than synchronise every step.
    at::_assert_async(out_of_range.any().logical_not());
    return;
  }
  if (!out_of_range.any().item<bool>()) return;
  const int64_t first = out_of_range.reshape({-1}).nonzero()[0][0].item<int64_t>();
  DS_CHECK(false, UsageError, who, ": target ", target.reshape({-1})[first].item<int64_t>(),
           " at token ", first, " is outside the vocabulary [0, ", vocab,
           ") and is not ignore_index (", ignore_index, ")");
}

at::Tensor reduce_token_losses(const at::Tensor& losses, const at::Tensor& counted,
                               LossReduction reduction) {
  switch (reduction) {
    case LossReduction::kNone:
      return losses;
    case LossReduction::kSum:
      return losses.sum();
    case LossReduction::kMean:
      return losses.sum() / counted.sum().to(losses.scalar_type());
  }
  throw Error("reduce_token_losses: unknown LossReduction");
}

}  // namespace deepspeed::nn

namespace deepspeed {

LmLoss parse_lm_loss(const std::string& name, const std::string& what) {
  if (name == "cross_entropy") return LmLoss::kCrossEntropy;
  if (name == "chunked") return LmLoss::kChunked;
  if (name == "fused") return LmLoss::kFused;
  throw UsageError(detail::str_cat(what, " must be cross_entropy, chunked or fused, got \"", name,
                                   "\""));
}

}  // namespace deepspeed

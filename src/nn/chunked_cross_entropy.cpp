// See deepspeed/cross_entropy.h.
//
// Note [Recomputed softmax]
// d loss_i / d logit_ij = softmax_ij - [j == target_i]. Forward keeps the log-sum-exp of each
// row (fp32) and a reference to the logits; backward rebuilds softmax_ij = exp(logit_ij - lse_i)
// one block of rows at a time, so the only [rows, vocab] tensor backward allocates is the
// gradient itself, in the logits' dtype. cross_entropy(logits.float()) would instead keep an fp32
// log-softmax and allocate an fp32 gradient and a copy of it in the logits' dtype.
#include "deepspeed/cross_entropy.h"

#include <algorithm>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "nn/token_losses.h"
#include "util/check.h"

namespace deepspeed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// DeepSpeed's block: about 256 MiB of fp32 temporaries whatever the vocabulary.
constexpr int64_t kBlockElements = int64_t{1} << 26;

class ChunkedCrossEntropyFunction
    : public torch::autograd::Function<ChunkedCrossEntropyFunction> {
 public:
  // Per-row losses, zero where the target is ignored.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& target, int64_t ignore_index, int64_t block_rows) {
    const int64_t rows = logits.size(0);
    const at::Tensor ignored = target.eq(ignore_index);
    const at::Tensor safe_target = target.masked_fill(ignored, 0);
    const auto f32 = logits.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({rows}, f32), picked = at::empty({rows}, f32);
    for (int64_t begin = 0; begin < rows; begin += block_rows) {
      const int64_t end = std::min(rows, begin + block_rows);
      const at::Tensor block = logits.slice(0, begin, end).to(at::kFloat);
      lse.slice(0, begin, end).copy_(at::logsumexp(block, {1}));
      picked.slice(0, begin, end)
          .copy_(block.gather(1, safe_target.slice(0, begin, end).unsqueeze(1)).squeeze(1));
    }
    ctx->save_for_backward({logits, safe_target, ignored, lse});
    ctx->saved_data["block_rows"] = block_rows;
    return (lse - picked).masked_fill_(ignored, 0.0);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    DS_CHECK(!at::GradMode::is_enabled(), UsageError,
             "chunked_cross_entropy: its backward cannot be differentiated again "
             "(create_graph); use cross_entropy for higher-order gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &logits = saved[0], &safe_target = saved[1], &ignored = saved[2],
                     &lse = saved[3];
    const int64_t block_rows = ctx->saved_data["block_rows"].toInt();
    const at::Tensor scale = grads[0].to(at::kFloat).masked_fill(ignored, 0.0);
    at::Tensor grad = at::empty_like(logits, at::MemoryFormat::Contiguous);
    const int64_t rows = logits.size(0);
    for (int64_t begin = 0; begin < rows; begin += block_rows) {  // Note [Recomputed softmax]
      const int64_t end = std::min(rows, begin + block_rows);
      at::Tensor p = logits.slice(0, begin, end).to(at::kFloat)
                         .sub(lse.slice(0, begin, end).unsqueeze(1))
                         .exp_();
      p.scatter_add_(1, safe_target.slice(0, begin, end).unsqueeze(1),
                     at::full({end - begin, 1}, -1.0, p.options()));
      p.mul_(scale.slice(0, begin, end).unsqueeze(1));
      grad.slice(0, begin, end).copy_(p);
    }
    return {grad, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                 const ChunkedCrossEntropyOptions& options) {
  const char* who = "chunked_cross_entropy";
  DS_CHECK(logits.dim() == 2 && target.dim() == 1 && target.size(0) == logits.size(0),
           UsageError, who, ": expected [rows, vocab] logits and [rows] targets, got ",
           logits.sizes(), " and ", target.sizes());
  DS_CHECK(at::isFloatingType(logits.scalar_type()), UsageError, who,
           ": logits must be floating point, got ", logits.scalar_type());
  DS_CHECK(!options.block_rows || *options.block_rows >= 1, UsageError, who,
           ": block_rows must be at least 1, got ", *options.block_rows);
  const at::Tensor t = target.to(logits.device());
  nn::check_class_targets(t, logits.size(1), options.ignore_index, who);
  const int64_t block_rows =
      options.block_rows.value_or(std::max<int64_t>(1, kBlockElements / std::max<int64_t>(
                                                                             1, logits.size(1))));
  const at::Tensor losses =
      ChunkedCrossEntropyFunction::apply(logits, t, options.ignore_index, block_rows);
  return nn::reduce_token_losses(losses, t.ne(options.ignore_index), options.reduction);
}

}  // namespace deepspeed

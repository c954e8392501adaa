// See deepspeed/cross_entropy.h.
//
// Note [Fused LM head]
// Forward takes the tokens a block of rows at a time: logits = hidden_rows @ W.T (+ b) in
// hidden's dtype, upcast, and only each token's log-sum-exp and target logit are kept. Backward
// takes the vocabulary a block of rows of W at a time: it recomputes the logits of every token
// for those rows, turns them into the loss gradient (softmax - one-hot, Note [Recomputed
// softmax]), and from it the weight gradient of those rows in one GEMM over all tokens and the
// block's share of the hidden gradient, summed in fp32 (a 16-bit running sum would drop late
// blocks' small contributions, and the result would depend on the block size).
//
// With a soft cap (Gemma 2's final_logit_softcapping) each block's logits are
// cap * tanh(z / cap), taken in hidden's dtype as the unfused head takes them; backward's
// gradient of the loss by z is then the gradient by the capped logits times 1 - tanh^2.
//
// Over a vocabulary-parallel head each rank does this for its rows. The log-sum-exp and the
// target logit of each token are combined over the group after the loop (three all-reduces of
// one float per token); in backward, each rank's share of the hidden gradient is summed over
// the group, as for a column-parallel layer.
#include "deepspeed/cross_entropy.h"

#include <algorithm>
#include <limits>

#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "comm/autograd_group.h"
#include "deepspeed/autocast.h"
#include "nn/token_losses.h"
#include "util/check.h"

namespace deepspeed {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Logit blocks never shrink below this many elements: narrower GEMMs run far below peak.
constexpr int64_t kMinBlockElements = int64_t{1} << 22;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// fp32 logits of `hidden` against rows of the head, soft-capped when `cap` > 0 (then `tanh`,
// if given, receives tanh(z / cap) in fp32); columns from `real_cols` on are padding.
at::Tensor logits_block(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                        int64_t real_cols, double cap, at::Tensor* tanh = nullptr) {
  at::Tensor lg = bias.defined() ? at::addmm(bias, hidden, weight.t()) : at::mm(hidden, weight.t());
  if (cap > 0) {
    at::Tensor t = lg.div_(cap).tanh_();
    if (tanh != nullptr) *tanh = t.to(at::kFloat);
    lg = t.mul(cap);
  }
  lg = lg.to(at::kFloat);
  if (real_cols < lg.size(1)) {
    lg.slice(1, real_cols).fill_(-std::numeric_limits<float>::infinity());
  }
  return lg;
}

// Each row's log-sum-exp, computed in place in the (fresh) block: at::logsumexp would allocate
// two more blocks. A row of padding only (-inf) gives -inf.
at::Tensor log_sum_exp_(at::Tensor& lg) {
  at::Tensor max = lg.amax(1, /*keepdim=*/true);
  max.masked_fill_(max.isinf(), 0.0);
  return lg.sub_(max).exp_().sum(1).log_().add_(max.squeeze(1));
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  // Per-token losses, zero where ignored. `local_target` is the target's row in `weight`
  // (0 where it lies elsewhere), `mine` whether it lies in weight's real rows here.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const c10::optional<at::Tensor>& bias_arg,
                            const at::Tensor& local_target, const at::Tensor& mine,
                            const at::Tensor& ignored, int64_t real_rows, int64_t chunk,
                            double cap, comm::Group group) {
    // Optional: LibTorch 1.x refuses an undefined tensor as an argument.
    const at::Tensor bias = bias_arg.value_or(at::Tensor());
    const int64_t tokens = hidden.size(0);
    const auto f32 = hidden.options().dtype(at::kFloat);
    at::Tensor lse = at::empty({tokens}, f32), picked = at::zeros({tokens}, f32);
    for (int64_t begin = 0; begin < tokens; begin += chunk) {  // Note [Fused LM head]
      const int64_t end = std::min(tokens, begin + chunk);
      at::Tensor lg = logits_block(hidden.slice(0, begin, end), weight, bias, real_rows, cap);
      picked.slice(0, begin, end)
          .copy_(lg.gather(1, local_target.slice(0, begin, end).unsqueeze(1)).squeeze(1));
      lse.slice(0, begin, end).copy_(log_sum_exp_(lg));
    }
    picked.masked_fill_(mine.logical_not(), 0.0);
    if (group.valid() && group.size() > 1) {
      at::Tensor max = lse.clone();
      comm::all_reduce(max, comm::ReduceOp::kMax, false, group);
      at::Tensor sum_exp = (lse - max).exp_();
      comm::all_reduce(sum_exp, comm::ReduceOp::kSum, false, group);
      lse = max.add_(sum_exp.log_());
      comm::all_reduce(picked, comm::ReduceOp::kSum, false, group);
    }
    ctx->save_for_backward({hidden, weight, bias, local_target, mine, ignored, lse});
    ctx->saved_data["real_rows"] = real_rows;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["cap"] = cap;
    comm::save_group(ctx, group);
    return (lse - picked).masked_fill_(ignored, 0.0);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    DS_CHECK(!at::GradMode::is_enabled(), UsageError,
             "linear_cross_entropy: its backward cannot be differentiated again "
             "(create_graph); compute the logits and use cross_entropy for higher-order gradients");
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &bias = saved[2],
                     &local_target = saved[3], &mine = saved[4], &ignored = saved[5],
                     &lse = saved[6];
    const int64_t real_rows = ctx->saved_data["real_rows"].toInt();
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const double cap = ctx->saved_data["cap"].toDouble();
    const comm::Group& group = comm::saved_group(ctx);
    const int64_t tokens = hidden.size(0), rows = weight.size(0);
    const at::Tensor scale = grads[0].to(at::kFloat).masked_fill(ignored, 0.0).unsqueeze(1);
    const bool need_hidden = ctx->needs_input_grad(0), need_weight = ctx->needs_input_grad(1),
               need_bias = bias.defined() && ctx->needs_input_grad(2);
    const bool fp32 = hidden.scalar_type() == at::kFloat;
    at::Tensor grad_hidden_acc = need_hidden ? at::zeros(hidden.sizes(), scale.options())
                                             : at::Tensor();
    at::Tensor grad_weight = need_weight ? at::empty_like(weight) : at::Tensor();
    at::Tensor grad_bias = need_bias ? at::empty_like(bias) : at::Tensor();
    // As many logits per block as a forward block had.
    const int64_t block = std::max<int64_t>(1, chunk * rows / std::max<int64_t>(1, tokens));
    for (int64_t begin = 0; begin < rows; begin += block) {  // Note [Fused LM head]
      const int64_t end = std::min(rows, begin + block);
      const at::Tensor w = weight.slice(0, begin, end);
      const at::Tensor b = bias.defined() ? bias.slice(0, begin, end) : at::Tensor();
      const int64_t real = std::clamp<int64_t>(real_rows - begin, 0, end - begin);
      at::Tensor tanh;
      at::Tensor p = logits_block(hidden, w, b, real, cap, &tanh).sub_(lse.unsqueeze(1)).exp_();
      const at::Tensor here =
          mine.logical_and(local_target.ge(begin)).logical_and(local_target.lt(end));
      p.scatter_add_(1, (local_target - begin).clamp(0, end - begin - 1).unsqueeze(1),
                     here.to(at::kFloat).neg().unsqueeze(1));
      p.mul_(scale);
      if (cap > 0) p.mul_(tanh.square().neg_().add_(1.0));  // through the cap
      const at::Tensor g = p.to(hidden.scalar_type());
      if (need_weight) {
        at::Tensor rows_grad = grad_weight.slice(0, begin, end);
        at::mm_out(rows_grad, g.t(), hidden);
      }
      if (need_bias) grad_bias.slice(0, begin, end).copy_(p.sum(0));
      if (need_hidden) {
        // A 16-bit block's product is taken in its dtype (the GEMM accumulates in fp32 and rounds
        // once; an fp32 GEMM over upcast copies runs several times slower where bf16 has AMX or
        // oneDNN) and summed into the fp32 accumulator.
        if (fp32) {
          grad_hidden_acc.addmm_(g, w);
        } else {
          grad_hidden_acc.add_(at::mm(g, w));
        }
      }
    }
    at::Tensor grad_hidden;
    if (need_hidden) {
      if (group.valid() && group.size() > 1) {
        comm::all_reduce(grad_hidden_acc, comm::ReduceOp::kSum, false, group);
      }
      grad_hidden = grad_hidden_acc.to(hidden.scalar_type());
    }
    return {grad_hidden, grad_weight, grad_bias, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& target,
                                const LinearCrossEntropyOptions& options) {
  const char* who = "linear_cross_entropy";
  DS_CHECK(hidden.dim() >= 1 && weight.dim() == 2 && weight.size(1) == hidden.size(-1),
           UsageError, who, ": expected hidden [..., dim] and weight [vocab rows, dim], got ",
           hidden.sizes(), " and ", weight.sizes());
  DS_CHECK(target.sizes() == hidden.sizes().slice(0, hidden.dim() - 1), UsageError, who,
           ": target ", target.sizes(), " does not match hidden ", hidden.sizes(),
           " without its last dimension");
  const c10::DeviceType device = hidden.device().type();
  const bool autocast = (device == c10::kCPU || device == c10::kCUDA) && autocast_enabled(device);
  DS_CHECK(at::isFloatingType(hidden.scalar_type()) && at::isFloatingType(weight.scalar_type()) &&
               (autocast || weight.scalar_type() == hidden.scalar_type()),
           UsageError, who, ": hidden and weight must share a floating dtype, got ",
           hidden.scalar_type(), " and ", weight.scalar_type());
  const at::Tensor bias = options.bias.value_or(at::Tensor());
  DS_CHECK(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0) &&
                               bias.scalar_type() == weight.scalar_type()),
           UsageError, who, ": bias must be [", weight.size(0), "] of weight's dtype, got ",
           bias.defined() ? bias.sizes() : at::IntArrayRef{}, " ",
           bias.defined() ? bias.scalar_type() : weight.scalar_type());
  DS_CHECK(!options.chunk_size || *options.chunk_size >= 1, UsageError, who,
           ": chunk_size must be at least 1, got ", *options.chunk_size);
  DS_CHECK(options.logit_softcap >= 0, UsageError, who, ": logit_softcap must be 0 (none) or "
           "positive, got ", options.logit_softcap);
  comm::Group group = options.tp_group.value_or(comm::Group());
  DS_CHECK(!group.valid() || group.is_member(), UsageError, who, ": this rank is not in ",
           group.describe());
  const int64_t ranks = group.valid() ? group.size() : 1;
  const int64_t rows = weight.size(0), dim = weight.size(1);
  DS_CHECK(rows >= 1, UsageError, who, ": weight has no vocabulary rows");
  const int64_t vocab_start = options.vocab_start.value_or(group.valid() ? group.rank() * rows : 0);
  const int64_t vocab_size = options.vocab_size.value_or(rows * ranks);
  DS_CHECK(vocab_start >= 0 && vocab_size >= 1, UsageError, who, ": vocab_start (", vocab_start,
           ") must be >= 0 and vocab_size (", vocab_size, ") >= 1");

  const at::Tensor flat_target = target.reshape({-1}).to(hidden.device());
  nn::check_class_targets(flat_target, vocab_size, options.ignore_index, who);
  const at::Tensor flat_hidden = hidden.reshape({-1, dim}).contiguous();
  const int64_t tokens = flat_hidden.size(0);
  const int64_t real_rows = std::clamp<int64_t>(vocab_size - vocab_start, 0, rows);
  const at::Tensor ignored = flat_target.eq(options.ignore_index);
  const at::Tensor local = flat_target - vocab_start;
  const at::Tensor mine =
      ignored.logical_not().logical_and(local.ge(0)).logical_and(local.lt(real_rows));
  const at::Tensor local_target = local.masked_fill(mine.logical_not(), 0);
  // By default a block of fp32 logits is about as large as the hidden states (DeepSpeed's rule).
  const int64_t budget = std::max(tokens * dim, kMinBlockElements);
  const int64_t chunk = options.chunk_size.value_or(
      ceil_div(std::max<int64_t>(tokens, 1),
               std::max<int64_t>(1, ceil_div(std::max<int64_t>(tokens, 1) * rows, budget))));

  // Under autocast the product is taken in its dtype, as autocast would take the unfused head's;
  // the casts stay outside the function (their backward returns the gradients in the parameters'
  // dtype) and autocast is off inside it, so that backward's recomputed logits equal forward's.
  at::Tensor h = flat_hidden, w = weight.contiguous(), b = bias;
  std::optional<AutocastScope> autocast_off;
  if (autocast) {
    const c10::ScalarType dtype = autocast_dtype(device);
    h = h.to(dtype);
    w = w.to(dtype);
    if (b.defined()) b = b.to(dtype);
    autocast_off.emplace(device, dtype, /*enabled=*/false);
  }
  const at::Tensor losses = LinearCrossEntropyFunction::apply(
      h, w, b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, local_target, mine,
      ignored, real_rows, chunk, options.logit_softcap, group);
  autocast_off.reset();
  const at::Tensor reduced =
      nn::reduce_token_losses(losses, ignored.logical_not(), options.reduction);
  return options.reduction == LossReduction::kNone ? reduced.view(target.sizes()) : reduced;
}

}  // namespace deepspeed

// Causal-LM losses that never hold a full-vocabulary fp32 tensor (DeepSpeed 0.19.8's
// runtime/chunked_cross_entropy.py and sequence/linear_cross_entropy.py).
//
// The usual loss, cross_entropy(logits.float(), target), keeps an fp32 [tokens, vocab]
// log-softmax for backward, and backward allocates two more: with a 49,152-token vocabulary and
// 4,096 tokens each is 0.8 GB, and all of them coexist where training memory peaks.
//
//   chunked_cross_entropy   the same loss from [tokens, vocab] logits of any dtype, keeping only
//                           the logits (not a copy) and one fp32 log-sum-exp per token; backward
//                           recomputes the softmax a block of rows at a time and writes the
//                           gradient in the logits' own dtype.
//   linear_cross_entropy    the LM head fused into the loss: hidden [tokens, dim] and the head's
//                           weight [vocab, dim] in, the loss out; the logits exist one block at a
//                           time, in forward and again in backward (one more GEMM of the head's
//                           size). Optionally over a vocabulary-parallel head: each rank holds
//                           a slice of the vocabulary's rows, the logits are never gathered.
//
// Both equal cross_entropy over fp32 logits within float rounding (tests/unit/nn), with its
// ignore_index and reductions: "mean" divides by the number of targets that are not ignored,
// so it is NaN when all are.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed {

enum class LossReduction { kNone, kSum, kMean };

struct ChunkedCrossEntropyOptions {
  int64_t ignore_index = -100;
  LossReduction reduction = LossReduction::kMean;
  /// Rows per block; by default as many as keep a block near 2^26 fp32 elements (DeepSpeed's).
  std::optional<int64_t> block_rows;
};

/// cross_entropy(logits.float(), target) for logits [rows, vocab] (any floating dtype) and int64
/// targets [rows]. Returns fp32: per-row losses [rows] (zero where ignored) for kNone, else a
/// scalar. UsageError for other shapes, a non-int64 target, a target outside [0, vocab) that is
/// not ignore_index, or block_rows < 1.
at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                 const ChunkedCrossEntropyOptions& options = {});

struct LinearCrossEntropyOptions {
  /// The head's bias [local vocab], if it has one.
  std::optional<at::Tensor> bias;
  /// A vocabulary-parallel head: `weight` holds this rank's rows of the (padded) vocabulary,
  /// `hidden` is the same on every rank of the group, and its gradient is summed over the group.
  std::optional<comm::Group> tp_group;
  /// The global vocabulary row of weight's first row; default tp rank x local rows.
  std::optional<int64_t> vocab_start;
  /// The real vocabulary size: rows at or past it are padding (Megatron's padded vocabulary)
  /// and stay out of the softmax. Default: the local rows x the group's size.
  std::optional<int64_t> vocab_size;
  int64_t ignore_index = -100;
  LossReduction reduction = LossReduction::kMean;
  /// Tokens per forward block (backward takes vocabulary blocks of as many logits). By default
  /// a block of fp32 logits is about as large as `hidden`, and at least 2^22 elements.
  std::optional<int64_t> chunk_size;
  /// Gemma 2's final_logit_softcapping: above 0, the logits are cap * tanh(logits / cap),
  /// taken in hidden's dtype as the unfused head takes them, before the softmax.
  double logit_softcap = 0.0;
};

/// cross_entropy((hidden @ weight.T + bias).float(), target) (its logits soft-capped with
/// logit_softcap) for hidden [..., dim], weight
/// [vocab rows, dim] and int64 target [...], without the [tokens, vocab] logits. The product is
/// taken in hidden's dtype, as the unfused head computes it, and the softmax in fp32. Returns
/// fp32: per-token losses in target's shape for kNone, else a scalar; the same on every rank of
/// tp_group. UsageError naming the argument for mismatched shapes or dtypes, out-of-range targets,
/// a chunk_size < 1 or a negative logit_softcap.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& target,
                                const LinearCrossEntropyOptions& options = {});

/// The form of a causal LM's loss that a training script offers its users (train_gpt's and
/// finetune_llama's --lm_loss): the logits, then cross_entropy; the logits, then
/// chunked_cross_entropy; or linear_cross_entropy (no logits).
enum class LmLoss { kCrossEntropy, kChunked, kFused };

/// "cross_entropy", "chunked" or "fused"; UsageError naming `what` otherwise.
LmLoss parse_lm_loss(const std::string& name, const std::string& what);

}  // namespace deepspeed

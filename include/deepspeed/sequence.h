// Sequence parallelism (DeepSpeed-Ulysses, deepspeed.sequence): the ranks of a sequence-parallel
// group each hold a contiguous 1/P of every sequence. Everything but attention is per token, so
// it runs on the local chunk as is; attention needs every position, so around it an all-to-all
// trades the sequence split for a split of the attention heads (each rank then attends over the
// whole sequence with H/P heads) and a second all-to-all trades it back.
//
//   seq_all_to_all            DeepSpeed's _SeqAllToAll: split one dimension P ways, send part j
//                             to rank j, concatenate what arrives along another dimension.
//   DistributedAttention      DeepSpeed's DistributedAttention around any local attention.
//   shard_sequence            this rank's chunk of a batch (UlyssesSPDataLoaderAdapter's split).
//   gather_sequence           the chunks concatenated; backward keeps this rank's slice.
//   vocab_sequence_parallel_cross_entropy
//                             DeepSpeed's: per-token losses of the whole sequence on every rank,
//                             each rank's backward reaching only its own tokens' logits.
//
// The engine side (config `sequence_parallel_size`): see docs/sequence_parallel.md. The
// engine sums gradients over a sequence-parallel group and averages them over the data-parallel
// ranks, as DeepSpeed does, so a loss each rank computes for the whole sequence through
// vocab_sequence_parallel_cross_entropy (or gather_sequence) trains exactly as one rank would on
// the whole sequence.
#pragma once

#include <cstdint>
#include <functional>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed::sequence {

/// Splits `input` along `scatter_idx` into group.size() equal parts, sends part j to group rank
/// j, and concatenates the parts received (in group-rank order) along `gather_idx`. Autograd's
/// backward is the inverse exchange (scatter and gather swapped). Negative indices count from
/// the end. UsageError naming the group when input.size(scatter_idx) is not divisible by its
/// size. The identity on a group of one rank.
at::Tensor seq_all_to_all(const at::Tensor& input, const comm::Group& group, int64_t scatter_idx,
                          int64_t gather_idx);

/// DeepSpeed's DistributedAttention: q, k, v arrive split along the sequence dimension
/// (`gather_idx`, 0 for Megatron's [s, b, h, d]; 1 for [b, s, h, d]) with every head; the
/// local attention receives the whole sequence with 1/P of the heads (`scatter_idx`), and its
/// output goes back to the sequence split. The local attention sees the layout it was given.
class DistributedAttention {
 public:
  using LocalAttention =
      std::function<at::Tensor(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v)>;

  DistributedAttention(LocalAttention local_attention, comm::Group sequence_process_group,
                       int64_t scatter_idx = 2, int64_t gather_idx = 0);

  at::Tensor forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value) const;
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) const {
    return forward(q, k, v);
  }

  const comm::Group& group() const { return group_; }

 private:
  LocalAttention local_attention_;
  comm::Group group_;
  int64_t scatter_idx_;
  int64_t gather_idx_;
};

/// This rank's contiguous 1/P of `x` along `dim` (no autograd edge beyond narrow's). What each
/// rank of a sequence-parallel group feeds the model: the same samples, its slice of the tokens.
/// UsageError when x.size(dim) is not divisible by the group's size.
at::Tensor shard_sequence(const at::Tensor& x, const comm::Group& group, int64_t dim);

/// The group's chunks of `x` concatenated along `dim`, in group-rank order. Backward hands this
/// rank the slice of the gradient for its own chunk, not a sum: every rank computes the same
/// function of the gathered tensor, and the engine's reduction sums the ranks' gradients.
at::Tensor gather_sequence(const at::Tensor& x, const comm::Group& group, int64_t dim);

/// DeepSpeed's vocab_sequence_parallel_cross_entropy: logits [S/P, B, V] and target [S/P, B]
/// (int64) of this rank's chunk -> the per-token losses [S, B] of the whole sequence, on every
/// rank of `group`. Their mean is the whole sequence's loss; its gradient on each rank flows to
/// that rank's logits only.
at::Tensor vocab_sequence_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                                 const comm::Group& group);

}  // namespace deepspeed::sequence

// DeepSpeed-Ulysses' exchanges as autograd functions over a comm::Group (deepspeed/sequence/
// layer.py). One general all-to-all replaces DeepSpeed's per-layout permutes: whatever the
// layout, splitting dimension `scatter` P ways and concatenating along `gather` is what each of
// its (batch_dim_idx, scatter_idx) cases computes.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "comm/autograd_group.h"
#include "deepspeed/sequence.h"
#include "util/check.h"

namespace deepspeed::sequence {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using comm::save_group;
using comm::saved_group;

int64_t part_size(const at::Tensor& x, int64_t dim, const comm::Group& group, const char* what) {
  const int64_t n = x.size(dim);
  if (n % group.size() != 0) {
    throw UsageError(std::string("sequence parallelism: ") + what + " of size " +
                     std::to_string(n) + " (dimension " + std::to_string(dim) +
                     " of a tensor of shape " + c10::str(x.sizes()) +
                     ") is not divisible by the sequence-parallel size " +
                     std::to_string(group.size()) + " of group " + group.describe());
  }
  return n / group.size();
}

at::Tensor exchange(const at::Tensor& x, const comm::Group& group, int64_t scatter,
                    int64_t gather) {
  const int64_t p = group.size();
  const int64_t part = part_size(x, scatter, group, "the scattered dimension");
  // [..., P * part, ...] -> [P, ..., part, ...]: block j is what rank j receives.
  std::vector<int64_t> split = x.sizes().vec();
  split[static_cast<size_t>(scatter)] = part;
  split.insert(split.begin() + scatter, p);
  at::Tensor send = x.reshape(split).movedim(scatter, 0).contiguous();
  at::Tensor received = at::empty_like(send);
  comm::all_to_all_single(received, send, false, group);
  // [P, ..., n, ...] -> [..., P * n, ...] along `gather`, block j (from rank j) first-major.
  std::vector<int64_t> out = x.sizes().vec();
  out[static_cast<size_t>(scatter)] = part;
  out[static_cast<size_t>(gather)] *= p;
  return received.movedim(0, gather).reshape(out);
}

class SeqAllToAll : public torch::autograd::Function<SeqAllToAll> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group,
                            int64_t scatter, int64_t gather) {
    save_group(ctx, group);
    ctx->saved_data["scatter"] = scatter;
    ctx->saved_data["gather"] = gather;
    return exchange(x, group, scatter, gather);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t scatter = ctx->saved_data["scatter"].toInt();
    const int64_t gather = ctx->saved_data["gather"].toInt();
    return {exchange(grads[0].contiguous(), saved_group(ctx), gather, scatter), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor gather_along(const at::Tensor& x, const comm::Group& group, int64_t dim) {
  at::Tensor in = x.contiguous();
  at::Tensor flat = at::empty({group.size() * in.numel()}, in.options());
  comm::all_gather(flat, in, false, group);
  std::vector<int64_t> stacked = in.sizes().vec();
  stacked.insert(stacked.begin(), group.size());
  std::vector<int64_t> out = in.sizes().vec();
  out[static_cast<size_t>(dim)] *= group.size();
  return flat.view(stacked).movedim(0, dim).reshape(out);
}

at::Tensor own_slice(const at::Tensor& x, const comm::Group& group, int64_t dim) {
  const int64_t part = part_size(x, dim, group, "the sequence dimension");
  return x.narrow(dim, group.rank() * part, part);
}

class GatherSequence : public torch::autograd::Function<GatherSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group,
                            int64_t dim) {
    save_group(ctx, group);
    ctx->saved_data["dim"] = dim;
    return gather_along(x, group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t dim = ctx->saved_data["dim"].toInt();
    return {own_slice(grads[0], saved_group(ctx), dim).contiguous(), at::Tensor(), at::Tensor()};
  }
};

int64_t wrap(int64_t dim, const at::Tensor& x, const char* what) {
  const int64_t rank = x.dim();
  DS_CHECK(dim >= -rank && dim < rank, UsageError, "sequence parallelism: ", what, " ", dim,
           " is out of range for a tensor of ", rank, " dimensions");
  return dim < 0 ? dim + rank : dim;
}

}  // namespace

at::Tensor seq_all_to_all(const at::Tensor& input, const comm::Group& group, int64_t scatter_idx,
                          int64_t gather_idx) {
  const int64_t scatter = wrap(scatter_idx, input, "scatter_idx");
  const int64_t gather = wrap(gather_idx, input, "gather_idx");
  DS_CHECK(scatter != gather, UsageError, "sequence parallelism: scatter_idx and gather_idx ",
           "are both dimension ", scatter);
  if (group.size() == 1) return input;
  return SeqAllToAll::apply(input, group, scatter, gather);
}

DistributedAttention::DistributedAttention(LocalAttention local_attention,
                                           comm::Group sequence_process_group, int64_t scatter_idx,
                                           int64_t gather_idx)
    : local_attention_(std::move(local_attention)), group_(std::move(sequence_process_group)),
      scatter_idx_(scatter_idx), gather_idx_(gather_idx) {
  DS_CHECK(static_cast<bool>(local_attention_), UsageError,
           "DistributedAttention needs a local attention function");
  DS_CHECK(group_.is_member(), UsageError, "DistributedAttention: this rank (",
           comm::get_rank(), ") is not in the sequence-parallel group ", group_.describe());
}

at::Tensor DistributedAttention::forward(const at::Tensor& query, const at::Tensor& key,
                                         const at::Tensor& value) const {
  // Sequence split, all heads -> whole sequence, 1/P of the heads (DeepSpeed's order: q, k, v).
  at::Tensor q = seq_all_to_all(query, group_, scatter_idx_, gather_idx_);
  at::Tensor k = seq_all_to_all(key, group_, scatter_idx_, gather_idx_);
  at::Tensor v = seq_all_to_all(value, group_, scatter_idx_, gather_idx_);
  at::Tensor context = local_attention_(q, k, v);
  return seq_all_to_all(context, group_, gather_idx_, scatter_idx_);
}

at::Tensor shard_sequence(const at::Tensor& x, const comm::Group& group, int64_t dim) {
  const int64_t d = wrap(dim, x, "dim");
  if (group.size() == 1) return x;
  return own_slice(x, group, d);
}

at::Tensor gather_sequence(const at::Tensor& x, const comm::Group& group, int64_t dim) {
  const int64_t d = wrap(dim, x, "dim");
  if (group.size() == 1) return x;
  return GatherSequence::apply(x, group, d);
}

at::Tensor vocab_sequence_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& target,
                                                 const comm::Group& group) {
  DS_CHECK(logits.dim() == 3 && target.dim() == 2 && logits.size(0) == target.size(0) &&
               logits.size(1) == target.size(1),
           UsageError, "vocab_sequence_parallel_cross_entropy: expected logits [S/P, B, V] and ",
           "target [S/P, B]; got ", c10::str(logits.sizes()), " and ", c10::str(target.sizes()));
  const int64_t vocab = logits.size(2);
  // Matches DeepSpeed: the local tokens' losses in the logits' dtype, then every rank's.
  at::Tensor local = at::nll_loss(at::log_softmax(logits.reshape({-1, vocab}), -1),
                                  target.reshape({-1}), {}, at::Reduction::None)
                         .view(target.sizes());
  return gather_sequence(local, group, 0);
}

}  // namespace deepspeed::sequence

// ColumnParallelLinear, RowParallelLinear and VocabParallelEmbedding (Megatron's layers.py).
// Each builds the full weight with the caller's generator, exactly as the single-process layer
// would, and keeps its slice: the same seed gives the same full model on any number of ranks.
#include <torch/torch.h>

#include "deepspeed/tensor_parallel.h"
#include "util/check.h"

namespace deepspeed::tensor_parallel {
namespace {

// The full weight and bias of a torch::nn::Linear(in, out) initialized as LibTorch does (or by
// `init`, with a zero bias as Megatron's layers).
std::pair<at::Tensor, at::Tensor> full_linear(int64_t in, int64_t out, bool bias,
                                              const InitMethod& init) {
  torch::NoGradGuard no_grad;
  if (init) {
    at::Tensor w = at::empty({out, in});
    init(w);
    return {w, bias ? at::zeros({out}) : at::Tensor()};
  }
  torch::nn::Linear dense(torch::nn::LinearOptions(in, out).bias(bias));
  return {dense->weight.detach().clone(), bias ? dense->bias.detach().clone() : at::Tensor()};
}

void check_split(const char* layer, const char* what, int64_t size, const comm::Group& group) {
  DS_CHECK(size % group.size() == 0, ConfigError, "tensor_parallel::", layer, ": ", what, " (",
           size, ") is not divisible by the tensor-parallel size (", group.size(), ")");
}

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(int64_t in_features, int64_t out_features,
                                                   comm::Group group,
                                                   ColumnParallelLinearOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  check_split("ColumnParallelLinear", "out_features", out_features / options_.partition_stride,
              group_);
  auto [w, b] = full_linear(in_features, out_features, options_.bias, options_.init_method);
  const int T = group_.size(), r = group_.rank();
  weight = register_parameter("weight", shard_of(w, 0, T, r, options_.partition_stride));
  mark_tensor_parallel(weight, group_, 0, options_.partition_stride);
  if (options_.bias) {
    bias = register_parameter("bias", shard_of(b, 0, T, r, options_.partition_stride));
    mark_tensor_parallel(bias, group_, 0, options_.partition_stride);
  }
}

at::Tensor ColumnParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor y = at::linear(copy_to_model_parallel_region(x, group_), weight, bias);
  return options_.gather_output ? gather_from_model_parallel_region(y, group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(int64_t in_features, int64_t out_features,
                                             comm::Group group, RowParallelLinearOptions options)
    : group_(std::move(group)), options_(std::move(options)) {
  check_split("RowParallelLinear", "in_features", in_features, group_);
  auto [w, b] = full_linear(in_features, out_features, options_.bias, options_.init_method);
  weight = register_parameter("weight", shard_of(w, 1, group_.size(), group_.rank()));
  mark_tensor_parallel(weight, group_, 1);
  if (options_.bias) bias = register_parameter("bias", b);  // replicated: added once
}

at::Tensor RowParallelLinearImpl::forward(const at::Tensor& x) {
  at::Tensor in = options_.input_is_parallel ? x : scatter_to_model_parallel_region(x, group_);
  at::Tensor y = reduce_from_model_parallel_region(at::linear(in, weight), group_);
  return bias.defined() ? y + bias : y;
}

int64_t padded_vocab_size(int64_t vocab_size, int64_t make_vocab_size_divisible_by, int tp_size) {
  DS_CHECK(vocab_size > 0 && make_vocab_size_divisible_by > 0 && tp_size > 0, UsageError,
           "tensor_parallel::padded_vocab_size: vocab_size (", vocab_size,
           "), make_vocab_size_divisible_by (", make_vocab_size_divisible_by,
           ") and the tensor-parallel size (", tp_size, ") must be positive");
  const int64_t multiple = make_vocab_size_divisible_by * tp_size;
  return (vocab_size + multiple - 1) / multiple * multiple;
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(int64_t vocab_size, int64_t embedding_dim,
                                                       comm::Group group,
                                                       VocabParallelEmbeddingOptions options)
    : group_(std::move(group)), vocab_size_(vocab_size) {
  padded_size_ = tensor_parallel::padded_vocab_size(vocab_size, options.make_vocab_size_divisible_by,
                                                   group_.size());
  const int64_t per_rank = padded_size_ / group_.size();
  start_ = group_.rank() * per_rank;
  end_ = start_ + per_rank;
  at::Tensor full;
  {
    torch::NoGradGuard no_grad;
    full = at::empty({vocab_size, embedding_dim});
    if (options.init_method) {
      options.init_method(full);
    } else {
      full.normal_(0.0, 1.0);  // torch::nn::Embedding's reset_parameters
    }
    full = at::cat({full, at::zeros({padded_size_ - vocab_size, embedding_dim})}, 0);
  }
  weight = register_parameter("weight", full.narrow(0, start_, per_rank).contiguous());
  mark_tensor_parallel(weight, group_, 0);
}

at::Tensor VocabParallelEmbeddingImpl::forward(const at::Tensor& ids) {
  if (group_.size() == 1) return at::embedding(weight, ids);
  at::Tensor outside = (ids < start_).logical_or(ids >= end_);
  at::Tensor local = (ids - start_).masked_fill(outside, 0);
  at::Tensor out = at::embedding(weight, local).masked_fill(outside.unsqueeze(-1), 0.0);
  return reduce_from_model_parallel_region(out, group_);
}

}  // namespace deepspeed::tensor_parallel

// DeepSpeed's SparseSelfAttention and BertSparseSelfAttention modules over
// block_sparse_attention.
#include <ATen/ATen.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "deepspeed/sparse_attention.h"

namespace deepspeed::sparse_attention {

SparseSelfAttentionImpl::SparseSelfAttentionImpl(SparsityConfig sparsity,
                                                 MaskMode key_padding_mask_mode,
                                                 MaskMode attn_mask_mode, int64_t max_seq_length)
    : sparsity_(std::move(sparsity)),
      key_padding_mask_mode_(key_padding_mask_mode),
      attn_mask_mode_(attn_mask_mode) {
  master_layout = register_buffer("master_layout", sparsity_.make_layout(max_seq_length));
}

at::Tensor SparseSelfAttentionImpl::layout(int64_t seq_len) const {
  const int64_t block = sparsity_.block();
  if (seq_len % block != 0) {
    throw std::invalid_argument("SparseSelfAttention: the sequence length " +
                                std::to_string(seq_len) + " is not a multiple of the block size " +
                                std::to_string(block));
  }
  const int64_t n = seq_len / block;
  if (n > master_layout.size(1)) {
    throw std::invalid_argument("SparseSelfAttention: " + std::to_string(seq_len) +
                                " tokens exceed max_seq_length " +
                                std::to_string(master_layout.size(1) * block));
  }
  // Module::to(dtype) converts integer buffers too: read the 0/1 entries back as int64.
  return master_layout.slice(1, 0, n).slice(2, 0, n).to(at::kLong);
}

const BlockSparsePlan& SparseSelfAttentionImpl::plan(int64_t seq_len, int64_t heads) {
  const std::pair<const void*, int64_t> now{master_layout.data_ptr(), master_layout._version()};
  if (now != plans_of_) {  // a new layout: the plans of the old one go
    plans_.clear();
    plans_of_ = now;
  }
  const int64_t all = master_layout.size(0);
  if (heads < 0) heads = all;
  if (heads < 1 || heads > all) {
    throw std::invalid_argument("SparseSelfAttention: " + std::to_string(heads) +
                                " heads asked of a layout of " + std::to_string(all));
  }
  const auto key = std::make_pair(seq_len, heads);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    it = plans_.emplace(key, BlockSparsePlan(layout(seq_len).slice(0, 0, heads))).first;
  }
  return it->second;
}

at::Tensor SparseSelfAttentionImpl::forward(const at::Tensor& q, const at::Tensor& k_in,
                                            const at::Tensor& v, const AttentionExtras& extras) {
  if (q.dim() != 4) {
    throw std::invalid_argument(
        "SparseSelfAttention: query must be [batch, heads, tokens, "
        "head_dim]; it has " +
        std::to_string(q.dim()) + " dimensions");
  }
  const int64_t B = q.size(0), T = q.size(2);
  // DeepSpeed accepts keys already transposed for the product.
  const at::Tensor k = k_in.dim() == 4 && k_in.size(2) != T ? k_in.transpose(2, 3) : k_in;
  AttentionExtras e = extras;
  if (e.key_padding_mask.defined()) {
    if (e.key_padding_mask.numel() != B * T) {
      throw std::invalid_argument(
          "SparseSelfAttention: key_padding_mask must hold [batch, "
          "tokens] = " +
          std::to_string(B * T) + " values");
    }
    e.key_padding_mask = e.key_padding_mask.reshape({B, T});
  }
  if (e.attn_mask.defined()) {
    if (e.attn_mask.numel() != T * T) {
      throw std::invalid_argument("SparseSelfAttention: attn_mask must be [tokens, tokens] = [" +
                                  std::to_string(T) + ", " + std::to_string(T) + "]");
    }
    e.attn_mask = e.attn_mask.reshape({T, T});
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return block_sparse_attention(q, k, v, plan(T, q.size(1)), sparsity_.block(), scale, e,
                                key_padding_mask_mode_, attn_mask_mode_);
}

BertSparseSelfAttentionImpl::BertSparseSelfAttentionImpl(int64_t hidden_size,
                                                         int64_t num_attention_heads,
                                                         SparsityConfig sparsity)
    : num_heads_(num_attention_heads) {
  if (num_attention_heads < 1 || hidden_size % num_attention_heads != 0) {
    throw std::invalid_argument("BertSparseSelfAttention: the hidden size (" +
                                std::to_string(hidden_size) +
                                ") is not a multiple of the number of attention heads (" +
                                std::to_string(num_attention_heads) + ")");
  }
  head_size_ = hidden_size / num_attention_heads;
  query = register_module("query", torch::nn::Linear(hidden_size, hidden_size));
  key = register_module("key", torch::nn::Linear(hidden_size, hidden_size));
  value = register_module("value", torch::nn::Linear(hidden_size, hidden_size));
  sparse_self_attention =
      register_module("sparse_self_attention", SparseSelfAttention(std::move(sparsity)));
}

at::Tensor BertSparseSelfAttentionImpl::forward(const at::Tensor& hidden_states,
                                                const at::Tensor& attention_mask) {
  const int64_t B = hidden_states.size(0), T = hidden_states.size(1);
  auto heads = [&](const at::Tensor& x) {
    return x.view({B, T, num_heads_, head_size_}).permute({0, 2, 1, 3});
  };
  AttentionExtras extras;
  extras.key_padding_mask = attention_mask;
  const at::Tensor context = sparse_self_attention(
      heads(query(hidden_states)), heads(key(hidden_states)), heads(value(hidden_states)), extras);
  return context.permute({0, 2, 1, 3}).contiguous().view({B, T, num_heads_ * head_size_});
}

}  // namespace deepspeed::sparse_attention

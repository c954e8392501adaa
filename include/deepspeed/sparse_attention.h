// DeepSpeed's sparse attention: block-sparse self-attention over the patterns of the
// sparse_attention section (fixed, variable, BigBird, BSLongformer, dense; and the local sliding
// window), on any device LibTorch runs. As in DeepSpeed:
//
//   auto cfg = deepspeed::sparse_attention::sparse_attention_config(ds_config);  // optional
//   deepspeed::sparse_attention::SparseSelfAttention attn(
//       deepspeed::sparse_attention::SparsityConfig(num_heads, *cfg));
//   auto context = attn(q, k, v, {.attn_mask = causal});   // [B, H, T, D] each
//
// DeepSpeed's kernels (Triton, GPU and fp16 only) compute the scores of the layout's blocks,
// a softmax over each row's blocks and the blocks' products with the values. Here the same
// three steps run as batched matrix products over each row block's gathered key and value
// blocks, in any floating dtype, with LibTorch's autograd; work and memory grow with the
// layout's blocks rather than with T^2.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "deepspeed/sparse_attention_config.h"

namespace deepspeed::sparse_attention {

/// DeepSpeed's SparsityConfig classes: the block layout of `num_heads` heads for a mode.
class SparsityConfig {
 public:
  /// Throws std::invalid_argument naming the key of an invalid `config` (check_sparsity).
  /// `seed` seeds the random blocks (variable, bigbird) as Python's random.seed(seed) does:
  /// the layout equals DeepSpeed's built after random.seed(seed), and every rank builds the
  /// same one (DeepSpeed broadcasts rank 0's instead).
  SparsityConfig(int64_t num_heads, SparseAttentionConfig config, int64_t seed = 0);

  /// DeepSpeed's make_layout: [num_heads, T / block, T / block] int64, 1 where a block of
  /// queries attends to a block of keys. T must be a multiple of block.
  at::Tensor make_layout(int64_t seq_len) const;

  int64_t num_heads() const { return num_heads_; }
  int64_t block() const { return config_.block; }
  const SparseAttentionConfig& config() const { return config_; }

 private:
  int64_t num_heads_;
  SparseAttentionConfig config_;
  int64_t seed_;
};

/// How a mask enters the scores (DeepSpeed's key_padding_mask_mode / attn_mask_mode): "add"
/// adds its values; "mul" keeps where it is non-zero and removes (-inf) where it is zero.
enum class MaskMode { kAdd, kMul };

/// What a forward may add to the scaled scores before the softmax (DeepSpeed's optional
/// arguments); undefined tensors are left out.
struct AttentionExtras {
  /// Relative position embedding [B or 1, H, T, T], added.
  at::Tensor rpe;
  /// [B, T] (or any shape that squeezes to it): per key.
  at::Tensor key_padding_mask;
  /// [T, T]: per query and key (a causal mask, say).
  at::Tensor attn_mask;
  /// Beyond DeepSpeed: removes every key after its query, as a lower-triangular attn_mask in
  /// "mul" mode would, without the T x T mask (decoders; blocks above the diagonal then cost
  /// their products but attend to nothing).
  bool causal = false;
};

namespace detail {
struct PlanTables;
}  // namespace detail

/// What block_sparse_attention needs of a layout: for each row of query blocks, the key blocks
/// it keeps, rows grouped by how many. Made once per layout (SparseSelfAttention keeps one per
/// sequence length), so that a forward neither reads the layout back from the device nor walks
/// it again.
class BlockSparsePlan {
 public:
  /// `layout`: [H, n, n], non-zero where a block of queries attends to a block of keys. The
  /// tables are kept on `device` (the layout's when nullopt): forwards there copy nothing.
  explicit BlockSparsePlan(const at::Tensor& layout,
                           std::optional<at::Device> device = std::nullopt);
  int64_t heads() const { return heads_; }
  int64_t blocks() const { return blocks_; }
  const detail::PlanTables& tables() const { return *tables_; }

 private:
  int64_t heads_, blocks_;
  std::shared_ptr<const detail::PlanTables> tables_;
};

/// The computation itself: softmax(q k^T * scale + extras) v over the blocks `plan`'s layout
/// ([H, T/block, T/block]) keeps, for q, k, v of [B, H, T, D]. Rows whose every block is masked
/// give NaN (as DeepSpeed's kernels). Differentiable in q, k and v.
at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const BlockSparsePlan& plan, int64_t block, double scale,
                                  const AttentionExtras& extras = {},
                                  MaskMode key_padding_mask_mode = MaskMode::kAdd,
                                  MaskMode attn_mask_mode = MaskMode::kMul);
/// The same from the layout itself (its plan made for this call).
at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& layout, int64_t block, double scale,
                                  const AttentionExtras& extras = {},
                                  MaskMode key_padding_mask_mode = MaskMode::kAdd,
                                  MaskMode attn_mask_mode = MaskMode::kMul);

/// DeepSpeed's SparseSelfAttention: the layout made once for max_seq_length and registered as
/// the buffer "master_layout" (so state dicts carry it, as DeepSpeed's); a forward on T tokens
/// uses its leading T/block blocks.
class SparseSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit SparseSelfAttentionImpl(SparsityConfig sparsity,
                                   MaskMode key_padding_mask_mode = MaskMode::kAdd,
                                   MaskMode attn_mask_mode = MaskMode::kMul,
                                   int64_t max_seq_length = 2048);

  /// q, k, v: [B, H, T, D] (k may come transposed, [B, H, D, T], as DeepSpeed accepts);
  /// scaled by D^-0.5. Self-attention only: the three shapes must agree.
  at::Tensor forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const AttentionExtras& extras = {});

  /// The layout a forward on `seq_len` tokens uses: [H, T/block, T/block] int64.
  at::Tensor layout(int64_t seq_len) const;
  /// Its plan for the first `heads` heads (all when -1), made on first use and kept until
  /// master_layout changes (a loaded state dict, say).
  const BlockSparsePlan& plan(int64_t seq_len, int64_t heads = -1);
  const SparsityConfig& sparsity() const { return sparsity_; }

  at::Tensor master_layout;

 private:
  SparsityConfig sparsity_;
  MaskMode key_padding_mask_mode_, attn_mask_mode_;
  std::map<std::pair<int64_t, int64_t>, BlockSparsePlan> plans_;  // by (seq_len, heads)
  std::pair<const void*, int64_t> plans_of_{nullptr, -1};  // master_layout's data and version
};
TORCH_MODULE(SparseSelfAttention);

/// DeepSpeed's BertSparseSelfAttention: query, key and value projections of a BERT layer and
/// sparse self-attention over them; forward(hidden [B, T, C], attention_mask) with the mask as
/// the key padding mask (added: BERT's extended mask of 0 and -10000).
class BertSparseSelfAttentionImpl : public torch::nn::Module {
 public:
  BertSparseSelfAttentionImpl(int64_t hidden_size, int64_t num_attention_heads,
                              SparsityConfig sparsity);
  at::Tensor forward(const at::Tensor& hidden_states, const at::Tensor& attention_mask);

  torch::nn::Linear query{nullptr}, key{nullptr}, value{nullptr};
  SparseSelfAttention sparse_self_attention{nullptr};

 private:
  int64_t num_heads_, head_size_;
};
TORCH_MODULE(BertSparseSelfAttention);

/// DeepSpeed's SparseAttentionUtils.pad_to_block_size for token ids: pads [B, T] tensors on
/// the right to a multiple of `block` (input ids and position ids with pad_token_id, the
/// attention mask with 0, token types with 0; undefined tensors stay undefined).
struct PaddedInputs {
  int64_t pad_len = 0;
  at::Tensor input_ids, attention_mask, token_type_ids, position_ids;
};
PaddedInputs pad_to_block_size(int64_t block, const at::Tensor& input_ids,
                               const at::Tensor& attention_mask, const at::Tensor& token_type_ids,
                               const at::Tensor& position_ids, int64_t pad_token_id);

/// SparseAttentionUtils.unpad_sequence_output: drops the last pad_len positions of [B, T, ...].
at::Tensor unpad_sequence_output(int64_t pad_len, const at::Tensor& sequence_output);

}  // namespace deepspeed::sparse_attention

// A GPT-2-style decoder: pre-LayerNorm blocks, causal self-attention written out, GELU(tanh)
// MLP of 4x width, tied input/output embeddings, dropout off unless GptConfig::dropout is set,
// blocks optionally activation-checkpointed. Parameter names follow GPT-2's
// (wte, wpe, h.N.ln_1, h.N.attn.c_attn, ...), so checkpoints read naturally in Python.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "deepspeed/comm.h"
#include "deepspeed/cross_entropy.h"
#include "deepspeed/forward_kwargs.h"
#include "deepspeed/random_ltd.h"
#include "deepspeed/sparse_attention.h"
#include "deepspeed/zero3.h"
#include "gpt_moe.h"

namespace deepspeed::examples {

struct GptConfig {
  int64_t vocab_size = 50257;
  int64_t block_size = 128;  // maximum sequence length
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  /// GPT-2's embd/attn/resid dropout probability (0.1 there), applied in training mode only; 0
  /// leaves the dropout calls out (and the generator untouched).
  double dropout = 0.0;
  /// Runs each block through checkpointing::checkpoint (recomputed in backward).
  bool activation_checkpointing = false;
  /// Mixture of Experts (off by default): which blocks' MLPs become MoE layers (gpt_moe.h).
  GptMoeConfig moe;
  /// DeepSpeed's sparse attention (ds_config's sparse_attention section): each block attends
  /// through block_sparse_attention over the pattern's layout for n_head heads, with a causal
  /// mask (no dropout on the attention weights, as DeepSpeed's). block_size and every
  /// sequence length trained on must be multiples of its block. nullopt: dense attention.
  std::optional<sparse_attention::SparseAttentionConfig> sparse_attention;
  /// Seeds the pattern's random blocks (as Python's random.seed).
  int64_t sparse_attention_seed = 0;
  /// The training and evaluation loss's form; all three give the same loss (within rounding;
  /// in bf16/fp16 the chunked and fused ones take the softmax in fp32, cross_entropy in the
  /// logits' dtype). Under sequence parallelism each rank takes its tokens' losses in that form
  /// and gathers the whole sequence's.
  LmLoss lm_loss = LmLoss::kCrossEntropy;
};

class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GptConfig& cfg);
  /// x: [B, T, C] -> [B, T, C]; under sequence parallelism T is this rank's chunk and the
  /// attention itself sees the whole sequence with n_head / P heads (DistributedAttention).
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  /// With GptConfig::sparse_attention: the layout for block_size tokens, registered as
  /// "sparse_self_attention" (its master_layout buffer in the state dict, as DeepSpeed's).
  sparse_attention::SparseSelfAttention sparse_self_attention{nullptr};
  /// DeepSpeed-Ulysses' group (GptImpl::set_sequence_parallel_group); nullopt: none.
  std::optional<comm::Group> sequence_group;

 private:
  /// softmax(q k^T / sqrt(hd)) v, causal, over [B, nh, T, hd]: dense, or block-sparse.
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

  int64_t n_head_;
  double dropout_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const GptConfig& cfg);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(Mlp);

class BlockImpl : public torch::nn::Module {
 public:
  /// Initializes its own weights (GPT-2's way, see GptImpl), so that a block built inside a
  /// zero::Init scope is complete before it is partitioned.
  /// `index`: the block's position (which blocks are MoE blocks, cfg.moe).
  explicit BlockImpl(const GptConfig& cfg, int64_t index = 0);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  Mlp mlp{nullptr};            // a dense block's MLP
  moe::MoE moe_mlp{nullptr};   // an MoE block's, registered as "mlp" (Megatron-DeepSpeed's name)
  torch::Tensor l_aux;         // the MoE layer's load-balancing loss of the last forward
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  /// Initializes weights GPT-2's way from the current torch generator state: N(0, 0.02), the
  /// residual projections N(0, 0.02/sqrt(2*n_layer)), zero biases, LayerNorm 1/0 (each block
  /// as it is built, then the embeddings and the final LayerNorm).
  explicit GptImpl(const GptConfig& cfg);

  /// idx: [B, T] int64 token ids -> logits [B, T, vocab]. `pld_theta` (progressive layer
  /// drop, training only): block i of L is kept with probability 1 - (i+1)/L * (1 - theta) and
  /// otherwise skipped (the residual stream passes through), as in the PLD paper. `random_ltd`
  /// (training only): the blocks random_ltd_layer_id names run on a random, order-keeping subset
  /// of each sequence's tokens (RandomLayerTokenDrop); the other tokens skip them.
  torch::Tensor logits(const torch::Tensor& idx, std::optional<double> pld_theta = std::nullopt,
                       const RandomLtdScheduler* random_ltd = nullptr);
  /// What logits() projects onto the vocabulary: the final LayerNorm's output [B, T, n_embd].
  torch::Tensor hidden_states(const torch::Tensor& idx,
                              std::optional<double> pld_theta = std::nullopt,
                              const RandomLtdScheduler* random_ltd = nullptr);
  /// Mean cross-entropy of predicting `targets` ([B, T]) from `idx`.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets);
  /// The engine's training forward: with a "seqlen" curriculum the step trains on the first
  /// curriculum_seqlen tokens of each sequence (Megatron-DeepSpeed's truncation); with
  /// progressive layer drop or random-LTD, blocks skip or tokens skip blocks as logits()
  /// describes.
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets,
                        const ForwardKwargs& kwargs);

  /// DeepSpeed-Ulysses (the engine's sequence_parallel_group(), of P ranks): forward() then
  /// takes the whole sequences, as before, keeps this rank's 1/P of the tokens (DeepSpeed's
  /// UlyssesSPDataLoaderAdapter split), attends across the group and returns the whole
  /// sequence's loss (vocab_sequence_parallel_cross_entropy) on every rank of it.
  void set_sequence_parallel_group(const comm::Group& group);

  const GptConfig& config() const { return cfg_; }
  /// The MoE layers' load-balancing losses of the last forward, summed (0 without MoE); the
  /// loss forward() returns includes cfg.moe.aux_loss_coef times it.
  double last_moe_aux_loss() const { return last_moe_aux_loss_; }
  int64_t num_parameters();

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList h{nullptr};  // the blocks, registered as h.0, h.1, ...
  /// The same blocks, each a ZeRO-3 unit (gathered around its forward and backward under
  /// stage 3; a plain block otherwise). forward() calls them through this type.
  std::vector<std::shared_ptr<zero::Unit<BlockImpl>>> blocks;
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  /// One block's forward on `x`, checkpointed when cfg.activation_checkpointing.
  torch::Tensor run_block(const std::shared_ptr<zero::Unit<BlockImpl>>& block,
                          const torch::Tensor& x);
  /// That the section fits this model (a decoder with [B, T, C] states and n_layer layers).
  void check_random_ltd(const RandomLtdConfig& c) const;

  GptConfig cfg_;
  std::optional<comm::Group> sequence_group_;
  double last_moe_aux_loss_ = 0.0;
};
TORCH_MODULE(Gpt);

}  // namespace deepspeed::examples

// GPT model implementation (see gpt_model.h).
#include "gpt_model.h"

#include "deepspeed/causal_attention.h"
#include "deepspeed/checkpointing.h"
#include "deepspeed/compression.h"
#include "deepspeed/cross_entropy.h"
#include "deepspeed/sequence.h"
#include "deepspeed/tensor_parallel.h"

#include <cmath>
#include <functional>
#include <string>

#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/torch.h>

namespace deepspeed::examples {
namespace {

// GPT-2's dropout; with p == 0 no call at all, so that a run without dropout draws nothing.
torch::Tensor maybe_dropout(const torch::Tensor& x, double p, bool training) {
  return p > 0.0 ? torch::dropout(x, p, training) : x;
}

}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GptConfig& cfg)
    : n_head_(cfg.n_head), dropout_(cfg.dropout) {
  TORCH_CHECK(cfg.n_embd % cfg.n_head == 0, "n_embd (", cfg.n_embd,
              ") must be divisible by n_head (", cfg.n_head, ")");
  c_attn = register_module("c_attn", torch::nn::Linear(cfg.n_embd, 3 * cfg.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(cfg.n_embd, cfg.n_embd));
  if (cfg.sparse_attention) {
    sparse_self_attention = register_module(
        "sparse_self_attention",
        sparse_attention::SparseSelfAttention(
            sparse_attention::SparsityConfig(cfg.n_head, *cfg.sparse_attention,
                                             cfg.sparse_attention_seed),
            sparse_attention::MaskMode::kAdd, sparse_attention::MaskMode::kMul, cfg.block_size));
  }
}

torch::Tensor CausalSelfAttentionImpl::attend(const torch::Tensor& q, const torch::Tensor& k,
                                              const torch::Tensor& v) {
  if (!sparse_self_attention) {
    return deepspeed::nn::causal_attention(q, k, v, dropout_, is_training());
  }
  const int64_t nh = q.size(1), n_head = sparse_self_attention->sparsity().num_heads();
  // Under tensor or sequence parallelism this rank attends with nh of the n_head heads; one
  // layout shared by all heads serves them, per-head layouts would need the heads' offsets.
  const bool per_head = sparse_self_attention->sparsity().config().different_layout_per_head;
  TORCH_CHECK(nh == n_head || !per_head,
              "sparse_attention.different_layout_per_head with tensor or sequence parallelism "
              "is not supported (each rank holds ", nh, " of the ", n_head, " heads)");
  sparse_attention::AttentionExtras extras;
  extras.causal = true;
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  return sparse_attention::block_sparse_attention(q, k, v,
                                                  sparse_self_attention->plan(q.size(2), nh),
                                                  sparse_self_attention->sparsity().block(),
                                                  scale, extras);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), hd = x.size(2) / n_head_;
  // Through tensor_parallel::linear: under AutoTP c_attn holds this rank's heads' q|k|v rows
  // and c_proj their columns, so the local width C and head count nh come from the output.
  auto qkv_all = tensor_parallel::linear(c_attn, x);
  const int64_t C = qkv_all.size(2) / 3, nh = C / hd;
  auto qkv = qkv_all.split(C, /*dim=*/2);
  // [B, T, nh, hd] in, [B, T, nh, hd] out; the attention itself works on [B, nh, T, hd].
  auto attend = [this](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return this->attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2);
  };
  auto q = qkv[0].view({B, T, nh, hd});
  auto k = qkv[1].view({B, T, nh, hd});
  auto v = qkv[2].view({B, T, nh, hd});
  torch::Tensor y;
  if (sequence_group && sequence_group->size() > 1) {
    // DeepSpeed-Ulysses: heads scattered (dim 2), the sequence gathered (dim 1).
    y = sequence::DistributedAttention(attend, *sequence_group, 2, 1)(q, k, v);
  } else {
    y = attend(q, k, v);
  }
  y = y.contiguous().view({B, T, C});
  return maybe_dropout(tensor_parallel::linear(c_proj, y), dropout_, is_training());
}

MlpImpl::MlpImpl(const GptConfig& cfg) : dropout_(cfg.dropout) {
  c_fc = register_module("c_fc", torch::nn::Linear(cfg.n_embd, 4 * cfg.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * cfg.n_embd, cfg.n_embd));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  auto hidden = torch::gelu(tensor_parallel::linear(c_fc, x), "tanh");
  return maybe_dropout(tensor_parallel::linear(c_proj, hidden), dropout_, is_training());
}

namespace {

// GPT-2's initialization by parameter name: LayerNorm weights 1, biases 0, the residual
// projections (c_proj) N(0, 0.02/sqrt(2*n_layer)), everything else N(0, 0.02).
// `skip`: parameters left as they are (and drawing nothing).
void init_gpt2_weights(torch::nn::Module& module, int64_t n_layer,
                       const std::function<bool(const std::string&)>& skip = {}) {
  torch::NoGradGuard no_grad;
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(n_layer));
  for (auto& item : module.named_parameters()) {
    const std::string& name = item.key();
    if (skip && skip(name)) continue;
    torch::Tensor& p = item.value();
    auto ends_with = [&](const std::string& s) {
      return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
    };
    if (ends_with("ln_1.weight") || ends_with("ln_2.weight") || ends_with("ln_f.weight")) {
      p.fill_(1.0);
    } else if (ends_with("bias")) {
      p.zero_();
    } else if (ends_with("c_proj.weight")) {
      p.normal_(0.0, residual_std);
    } else {
      p.normal_(0.0, 0.02);
    }
  }
}

}  // namespace

BlockImpl::BlockImpl(const GptConfig& cfg, int64_t index) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
  attn = register_module("attn", CausalSelfAttention(cfg));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
  if (cfg.moe.is_moe_block(index)) {
    // The experts are copies of the block's MLP (DeepSpeed deep-copies the expert module).
    moe_mlp = register_module(
        "mlp", moe::MoE(cfg.n_embd, [&cfg] { return torch::nn::AnyModule(Mlp(cfg)); },
                        cfg.moe.layer_options()));
  } else {
    mlp = register_module("mlp", Mlp(cfg));
  }
  // DeepSpeed's experts start as copies of one: GPT-2's init draws local expert 0 only (so the
  // rest of the model does not depend on the number of local experts, i.e. on ep_size), the
  // others copy it.
  init_gpt2_weights(*this, cfg.n_layer, [](const std::string& name) {
    const auto at = name.find("deepspeed_experts.");
    return at != std::string::npos && name.compare(at, 20, "deepspeed_experts.0.") != 0;
  });
  if (moe_mlp) {
    torch::NoGradGuard no_grad;
    auto& experts = *moe_mlp->deepspeed_moe->experts->deepspeed_experts;
    const auto first = experts[0]->parameters();
    for (size_t e = 1; e < experts.size(); ++e) {
      const auto ps = experts[e]->parameters();
      for (size_t k = 0; k < ps.size(); ++k) ps[k].copy_(first[k]);
    }
  }
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto y = x + attn(ln_1(x));
  if (!moe_mlp) return y + mlp(ln_2(y));
  auto [out, aux, counts] = moe_mlp(ln_2(y));
  l_aux = aux;
  return y + out;
}

GptImpl::GptImpl(const GptConfig& cfg) : cfg_(cfg) {
  wte = register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.block_size, cfg.n_embd));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    blocks.push_back(std::make_shared<zero::Unit<BlockImpl>>(cfg, i));
    h->push_back(blocks.back());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({cfg.n_embd})));
  // The blocks initialized themselves (before a zero::Init scope partitioned them).
  init_gpt2_weights(*wte, cfg.n_layer);
  init_gpt2_weights(*wpe, cfg.n_layer);
  ln_f->weight.detach().fill_(1.0);
  ln_f->bias.detach().zero_();
}

void GptImpl::set_sequence_parallel_group(const comm::Group& group) {
  sequence_group_ = group;
  for (auto& block : blocks) block->attn->sequence_group = group;
}

torch::Tensor GptImpl::logits(const torch::Tensor& idx, std::optional<double> pld_theta,
                              const RandomLtdScheduler* random_ltd) {
  // Tied embeddings: the output projection is the token embedding matrix.
  return torch::matmul(hidden_states(idx, pld_theta, random_ltd), wte->weight.t());
}

torch::Tensor GptImpl::hidden_states(const torch::Tensor& idx, std::optional<double> pld_theta,
                                     const RandomLtdScheduler* random_ltd) {
  // Under sequence parallelism `idx` is this rank's chunk of each sequence, at this offset.
  const int64_t parts = sequence_group_ ? sequence_group_->size() : 1;
  const int64_t T = idx.size(1), first = sequence_group_ ? sequence_group_->rank() * T : 0;
  TORCH_CHECK(T * parts <= cfg_.block_size, "sequence length ", T * parts,
              " exceeds block_size ", cfg_.block_size);
  auto pos = torch::arange(first, first + T, idx.options().dtype(torch::kLong));
  auto x = maybe_dropout(compression::embedding(wte, idx) + compression::embedding(wpe, pos),
                         cfg_.dropout, is_training());
  if (random_ltd != nullptr) check_random_ltd(random_ltd->config());
  // The kept tokens are drawn here, from torch's generator like the layer drops below, so the
  // data-parallel ranks keep the same positions and a resumed run draws as an uninterrupted one.
  const RandomLayerTokenDrop ltd(random_ltd, x, is_training());
  const auto n_layer = static_cast<double>(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const auto& block = blocks[i];
    if (pld_theta && is_training()) {
      // Drawn from torch's generator, which every rank seeds alike and advances alike, so the
      // data-parallel ranks skip the same blocks (under ZeRO-3 a block's gather is a collective
      // they must all issue), and a resumed run draws as the uninterrupted one (RNG states are
      // in the checkpoint).
      const double keep = 1.0 - static_cast<double>(i + 1) / n_layer * (1.0 - *pld_theta);
      if (torch::rand({1}, torch::kDouble).item<double>() >= keep) {
        if (block->moe_mlp) block->l_aux = torch::zeros({}, x.options());
        continue;
      }
    }
    x = ltd.forward(static_cast<int64_t>(i), x, [&](const torch::Tensor& in) {
      return run_block(block, in);
    });
  }
  return ln_f(x);
}

torch::Tensor GptImpl::run_block(const std::shared_ptr<zero::Unit<BlockImpl>>& block,
                                 const torch::Tensor& x) {
  if (!cfg_.activation_checkpointing) return block->forward(x);
  if (!block->moe_mlp) return checkpointing::checkpoint_module(block, x);
  // The checkpointed forward runs without a graph, so the load-balancing loss leaves it as a
  // second output (connected to the gate through the recomputation), not as the member the
  // block sets.
  auto out = checkpointing::checkpoint(
      [b = block](const std::vector<at::Tensor>& in) -> std::vector<at::Tensor> {
        auto y = b->forward(in[0]);
        return {y, b->l_aux};
      },
      {x});
  block->l_aux = out[1];
  return out[0];
}

void GptImpl::check_random_ltd(const RandomLtdConfig& c) const {
  TORCH_CHECK(c.model_type == "decoder" && c.hidden_state_order == "batch_seq_dim",
              "random_ltd: the example GPT is a decoder with [batch, seq, hidden] states; set "
              "model_type \"decoder\" and hidden_state_order \"batch_seq_dim\" (got \"",
              c.model_type, "\", \"", c.hidden_state_order, "\")");
  TORCH_CHECK(c.total_layer_num == cfg_.n_layer, "random_ltd.total_layer_num is ",
              c.total_layer_num, " but the model has ", cfg_.n_layer, " layers");
  TORCH_CHECK(!sequence_group_ || sequence_group_->size() == 1,
              "random_ltd with sequence parallelism: a rank holds only part of each sequence");
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  return forward(idx, targets, ForwardKwargs{});
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx_in, const torch::Tensor& targets_in,
                               const ForwardKwargs& kwargs) {
  torch::Tensor idx = idx_in, targets = targets_in;
  if (kwargs.curriculum_seqlen && *kwargs.curriculum_seqlen < idx.size(1)) {
    idx = idx.slice(1, 0, *kwargs.curriculum_seqlen);
    targets = targets.slice(1, 0, *kwargs.curriculum_seqlen);
  }
  const bool sequence_parallel = sequence_group_ && sequence_group_->size() > 1;
  if (sequence_parallel) {  // this rank's tokens of the whole sequences
    idx = sequence::shard_sequence(idx, *sequence_group_, 1);
    targets = sequence::shard_sequence(targets, *sequence_group_, 1);
  }
  const std::optional<double> pld_theta =
      kwargs.progressive_layer_drop ? std::optional<double>(kwargs.pld_theta) : std::nullopt;
  torch::Tensor loss;
  if (cfg_.lm_loss == LmLoss::kCrossEntropy) {
    auto lg = logits(idx, pld_theta, kwargs.random_ltd);
    loss = sequence_parallel  // the whole sequence's mean; backward reaches this rank's logits
               ? sequence::vocab_sequence_parallel_cross_entropy(
                     lg.transpose(0, 1), targets.transpose(0, 1), *sequence_group_)
                     .mean()
               : torch::nn::functional::cross_entropy(lg.view({-1, lg.size(-1)}),
                                                      targets.reshape({-1}));
  } else {
    // Under sequence parallelism: this rank's per-token losses, gathered as
    // vocab_sequence_parallel_cross_entropy gathers its own (every rank gets the whole
    // sequence's; backward reaches this rank's tokens).
    const LossReduction reduction = sequence_parallel ? LossReduction::kNone : LossReduction::kMean;
    if (cfg_.lm_loss == LmLoss::kFused) {
      LinearCrossEntropyOptions o;
      o.reduction = reduction;
      loss = linear_cross_entropy(hidden_states(idx, pld_theta, kwargs.random_ltd), wte->weight,
                                  targets, o);
    } else {
      ChunkedCrossEntropyOptions o;
      o.reduction = reduction;
      auto lg = logits(idx, pld_theta, kwargs.random_ltd);
      loss = chunked_cross_entropy(lg.view({-1, lg.size(-1)}), targets.reshape({-1}), o);
    }
    if (sequence_parallel) {
      loss = sequence::gather_sequence(loss.view(targets.sizes()).transpose(0, 1),
                                       *sequence_group_, 0)
                 .mean();
    }
  }
  // The load-balancing loss trains the gates; a held-out (eval) loss is the LM loss alone.
  if (!cfg_.moe.enabled() || !is_training()) return loss;
  torch::Tensor aux = torch::zeros({}, loss.options());
  for (const auto& block : blocks) {
    if (block->moe_mlp) aux = aux + block->l_aux;
  }
  last_moe_aux_loss_ = aux.item<double>();
  return cfg_.moe.aux_loss_coef != 0.0 ? loss + cfg_.moe.aux_loss_coef * aux : loss;
}

int64_t GptImpl::num_parameters() {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace deepspeed::examples

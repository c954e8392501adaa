// A Llama-architecture decoder (Hugging Face's LlamaForCausalLM, same parameter names): RMSNorm,
// rotary position embeddings, SwiGLU MLP (or Mixtral's and Qwen3-MoE's sparse MoE block, its
// experts stacked as DeepSpeed's AutoEP keeps them), grouped-query causal attention (Qwen3's
// with an RMSNorm per query and key head), optional tied output embedding, projection biases
// where the config has them (Qwen2's q/k/v), and a key/value cache for generation. Each decoder
// layer is a ZeRO-3 unit and can fill its weights while it is constructed, so that a model built
// inside zero::Init loads a pretrained checkpoint one layer at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "deepspeed/auto_ep.h"
#include "deepspeed/cross_entropy.h"
#include "deepspeed/zero3.h"
#include "llama_config.h"

namespace deepspeed::examples {

/// Gives the pretrained value (fp32, Hugging Face shape) of a parameter by its Hugging Face name
/// ("model.layers.3.self_attn.q_proj.weight"). Empty: initialise randomly instead.
using LlamaWeightSource = std::function<torch::Tensor(const std::string& hf_name)>;

/// The Hugging Face name of one expert's share of a stacked expert weight: "<block>.experts.w1"
/// and expert 3 -> "<block>.experts.3.w1.weight" in a Mixtral, "<block>.experts.3.gate_proj.weight"
/// in a Qwen3-MoE (w2: down_proj, w3: up_proj).
std::string hf_expert_name(const LlamaConfig& cfg, const std::string& stacked, int64_t expert);

/// transformers' load-balancing loss of Mixtral and Qwen3-MoE (load_balancing_loss_func, no
/// attention mask): over every sparse layer's router logits [tokens, num_experts] together,
/// num_experts * sum over the k choices and experts of (the share of tokens whose i-th choice is
/// the expert) * (the mean softmax probability of the expert). 1 at perfect balance, k at worst.
at::Tensor router_load_balancing_loss(const std::vector<at::Tensor>& router_logits,
                                      int64_t num_experts, int64_t top_k);

/// Keys and values of the positions seen so far, per layer: [B, kv_heads, T_past, head_dim]
/// (DeepSeek: the latents [B, 1, T_past, kv_lora_rank] and rotated shared keys
/// [B, 1, T_past, qk_rope_head_dim]).
struct LlamaKvCache {
  std::vector<torch::Tensor> keys, values;
  int64_t length() const { return keys.empty() || !keys[0].defined() ? 0 : keys[0].size(2); }
};

/// LlamaRMSNorm: normalised in fp32, cast back, times the weight. With `offset_from_one`,
/// GemmaRMSNorm: the weight is stored as an offset (zeros are the identity) and the product
/// (1 + weight) is taken in fp32 before the cast.
class RmsNormImpl : public torch::nn::Module {
 public:
  RmsNormImpl(int64_t dim, double eps, bool offset_from_one = false);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  bool offset_from_one_;
};
TORCH_MODULE(RmsNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  /// `prefix`: the module's qualified name with a trailing dot ("model.layers.3.self_attn."),
  /// which cfg.lora's target_mods are matched against; `layer`: its layer's index (Gemma 2's
  /// window is every other layer's).
  explicit LlamaAttentionImpl(const LlamaConfig& cfg, const std::string& prefix = "",
                              int64_t layer = 0);
  /// x [B, T, hidden]; cos/sin [T, head_dim] for the positions of x; `past_k/past_v` (may be
  /// null) the cache of this layer, extended in place.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        torch::Tensor* past_k, torch::Tensor* past_v);
  linear::OptimizedLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3, Gemma 3: over each head; else null

 private:
  int64_t n_head_, n_kv_head_, head_dim_;
  int64_t sliding_window_;  // Mistral: a query sees the last sliding_window_ keys; -1: all
  double scaling_;          // of the scores: head_dim^-1/2 (Gemma 2: query_pre_attn_scalar's)
  double softcap_;          // Gemma 2: scores soft-capped at this; 0: not
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  /// `width`: the SwiGLU width; 0: cfg.intermediate_size. Gemma's gate goes through
  /// tanh-approximated GELU (GeGLU) instead of SiLU.
  explicit LlamaMlpImpl(const LlamaConfig& cfg, const std::string& prefix = "", int64_t width = 0);
  torch::Tensor forward(const torch::Tensor& x);
  linear::OptimizedLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  bool gelu_tanh_ = false;
};
TORCH_MODULE(LlamaMlp);

class MultiLatentAttentionImpl;

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  /// Fills its weights from `weights` (names "model.layers.<index>.…") or, when empty, with
  /// N(0, 0.02) linear weights and unit norms, before a zero::Init scope partitions it.
  LlamaDecoderLayerImpl(const LlamaConfig& cfg, int64_t index, const LlamaWeightSource& weights);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        LlamaKvCache* cache);

  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  // Gemma 2 and 3: the norms before and after the MLP (their post_attention_layernorm then
  // normalises the attention's output). Null otherwise.
  RmsNorm pre_feedforward_layernorm{nullptr}, post_feedforward_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};  // null in a DeepSeek
  // DeepSeek's multi-head latent attention, registered as "self_attn"; null otherwise.
  std::shared_ptr<MultiLatentAttentionImpl> latent_attn;
  LlamaMlp mlp{nullptr};  // null in a sparse layer
  // A sparse layer's MLP, registered under transformers' name: "block_sparse_moe" (Mixtral) or
  // "mlp" (Qwen2-MoE, Qwen3-MoE). Null in a dense layer.
  moe::TokenChoiceMoE sparse_moe{nullptr};
  // Qwen2-MoE's shared expert and its gate, registered inside sparse_moe so that their names are
  // transformers' ("mlp.shared_expert.gate_proj.weight", "mlp.shared_expert_gate.weight"), and
  // applied here: TokenChoiceMoE's forward knows only the routed experts. DeepSeek's shared
  // experts, one MLP as wide as all of them ("mlp.shared_experts."), have no gate. Null
  // otherwise.
  LlamaMlp shared_expert{nullptr};
  torch::nn::Linear shared_expert_gate{nullptr};

 private:
  int64_t index_;
};

/// The decoder stack: Hugging Face's LlamaModel (embed_tokens, layers.N, norm).
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const LlamaConfig& cfg, const LlamaWeightSource& weights);
  /// ids [B, T] -> final hidden states [B, T, hidden]; with a cache, the positions continue it.
  torch::Tensor forward(const torch::Tensor& ids, LlamaKvCache* cache = nullptr);
  /// Gradient checkpointing: with grad enabled and no cache, each layer runs through
  /// deepspeed::checkpointing::checkpoint (its activations recomputed in backward; a sparse
  /// layer's router logits, with output_router_logits, are a second output of the checkpoint).
  void set_activation_checkpointing(bool on);
  /// With output_router_logits, the sparse layers' router logits [tokens, experts] of the last
  /// forward, in layer order, connected to the graph (checkpointed or not); empty otherwise.
  const std::vector<torch::Tensor>& router_logits() const { return router_logits_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  /// The same layers, each a ZeRO-3 unit; forward() calls them through this type.
  std::vector<std::shared_ptr<zero::Unit<LlamaDecoderLayerImpl>>> units;
  RmsNorm norm{nullptr};

 private:
  LlamaConfig cfg_;
  // Derived, so neither parameters nor buffers; set once the config is validated.
  std::optional<RotaryFrequencies> rope_;
  std::optional<RotaryFrequencies> rope_local_;  // Gemma 3's sliding layers'; else none
  bool activation_checkpointing_ = false;
  std::vector<torch::Tensor> router_logits_;
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  /// `weights` empty: random initialisation from the current torch generator.
  LlamaForCausalLMImpl(const LlamaConfig& cfg, const LlamaWeightSource& weights = {});
  /// ids [B, T] int64 -> logits [B, T, vocab] (fp32).
  torch::Tensor logits(const torch::Tensor& ids, LlamaKvCache* cache = nullptr);
  /// Mean next-token cross-entropy: predicting targets [B, T] from ids [B, T] (-100: ignored),
  /// in the form set_lm_loss() chose (all equal within rounding: the softmax is taken in fp32 in
  /// each); with output_router_logits, plus router_aux_loss_coef times the load-balancing loss.
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& targets);
  /// kCrossEntropy (default): the fp32 logits, then cross_entropy; kChunked: the logits in the
  /// model's dtype, then chunked_cross_entropy; kFused: linear_cross_entropy, no logits.
  void set_lm_loss(LmLoss form) { lm_loss_ = form; }
  const LlamaConfig& config() const { return cfg_; }
  /// The output projection's weight (embed_tokens' when tied).
  torch::Tensor output_weight() const;
  /// The logits of hidden states h, in their dtype (Gemma 2's soft-capped).
  torch::Tensor output_logits(const torch::Tensor& h) const;

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  LlamaConfig cfg_;
  LmLoss lm_loss_ = LmLoss::kCrossEntropy;
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace deepspeed::examples

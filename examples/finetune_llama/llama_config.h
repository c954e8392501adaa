// Hyper-parameters of a Llama-architecture decoder (Hugging Face's LlamaConfig fields, same names
// and meanings), read from GGUF metadata or a Hugging Face config.json and written back as one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepspeed/linear.h"
#include "rope_scaling.h"

namespace deepspeed::examples {

class GgufFile;

struct LlamaConfig {
  /// "llama", "mistral" (MistralForCausalLM: the same decoder, with a sliding window and no
  /// rope_scaling), "qwen2" (Qwen2ForCausalLM: biases on the q/k/v projections), "mixtral"
  /// (MixtralForCausalLM: Mistral's attention, and a sparse MoE block for each MLP), "qwen3"
  /// (Qwen3ForCausalLM: an RMSNorm on each query and key head), "qwen3_moe"
  /// (Qwen3MoeForCausalLM: Qwen3's attention, a sparse MoE block for the MLPs it chooses) or
  /// "qwen2_moe" (Qwen2MoeForCausalLM: Qwen2's attention, sparse blocks chosen alike, each with
  /// a gated shared expert) or "phi3" (Phi3ForCausalLM: Llama's decoder with q/k/v and gate/up
  /// fused in its files, longrope scaling, a sliding window when set) or "gemma"
  /// (GemmaForCausalLM: embeddings scaled by sqrt(hidden_size), RMSNorm weights stored as an
  /// offset from one, a GeGLU MLP) or "gemma2" (Gemma2ForCausalLM: Gemma's, with a norm after
  /// the attention and around the MLP, the sliding window on every other layer, soft-capped
  /// attention scores and logits) or "gemma3_text" (Gemma3ForCausalLM: Gemma 2's norms, an
  /// RMSNorm on each query and key head, the window on five layers of six, which rotate with a
  /// base of their own) or "deepseek_v2" / "deepseek_v3" (DeepseekV2ForCausalLM,
  /// DeepseekV3ForCausalLM: multi-head latent attention, sparse blocks with shared experts).
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < num_attention_heads: grouped-query attention
  int64_t head_dim = 0;             // hidden_size / num_attention_heads unless given
  double partial_rotary_factor = 1.0;  // Phi-3 (Phi-4-mini): the share of each head rotated
  int64_t max_position_embeddings = 2048;  // the context length
  int64_t original_max_position_embeddings = 0;  // Phi-3: the pretraining context (longrope's)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;  // none unless config.json or the GGUF file says otherwise
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens' weight
  int64_t bos_token_id = -1;         // -1: none
  int64_t eos_token_id = -1;
  int64_t pad_token_id = -1;
  // Mistral, Phi-3: attention to the last sliding_window positions; -1: all. Gemma 2: in the
  // layers of even index only (layer_sliding_window).
  int64_t sliding_window = -1;
  // Gemma 2: attention scores scaled by query_pre_attn_scalar^-1/2 instead of head_dim^-1/2
  // (0: head_dim); scores and logits soft-capped, s -> cap * tanh(s / cap) (0: not capped).
  double query_pre_attn_scalar = 0.0;
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // Gemma 3: which layers slide (its layer_types; empty: as sliding_window and the model type
  // say), and the rotary base of those (0: rope_theta); rope_scaling is the other layers'.
  std::vector<bool> sliding_layers;
  double rope_local_theta = 0.0;
  bool attention_bias = false;  // LlamaConfig's: biases on q/k/v/o_proj
  bool mlp_bias = false;        // LlamaConfig's: biases on gate/up/down_proj
  // Mixtral: each layer's MLP is a block_sparse_moe of num_local_experts SwiGLU experts, each
  // token sent to its num_experts_per_tok best (deepspeed::moe::TokenChoiceMoE). 0: dense.
  // Qwen3-MoE (config.json's num_experts): the `mlp` of the layers is_sparse_layer() picks.
  int64_t num_local_experts = 0;
  int64_t num_experts_per_tok = 2;
  int64_t moe_intermediate_size = 0;  // Qwen3-MoE's expert width; 0: intermediate_size
  bool norm_topk_prob = true;         // the k scores divided by their sum (Mixtral always)
  int64_t decoder_sparse_step = 1;    // Qwen3-MoE: layer i is sparse when (i + 1) % step == 0
  std::vector<int64_t> mlp_only_layers;  // Qwen3-MoE: layers kept dense whatever the step
  // Qwen2-MoE: each sparse block adds sigmoid(shared_expert_gate x) * shared_expert(x), a SwiGLU
  // MLP of this width every token goes through. 0: none.
  int64_t shared_expert_intermediate_size = 0;
  // Mixtral and Qwen3-MoE: the loss adds router_aux_loss_coef times transformers'
  // load-balancing loss over the sparse layers' router logits.
  bool output_router_logits = false;
  double router_aux_loss_coef = 0.001;
  // DeepSeek-V2 and V3: multi-head latent attention (mla_attention.h). Queries through a
  // q_lora_rank bottleneck (0: one q_proj), keys and values expanded from a kv_lora_rank latent;
  // each head's query and key hold qk_nope_head_dim unrotated features, then qk_rope_head_dim
  // rotated ones (head_dim, what the rotary embedding spans), its value v_head_dim.
  // rope_interleave: the rotated features come in adjacent pairs (DeepSeek-V3's default, always
  // in V2) rather than in halves.
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool rope_interleave = true;
  // DeepSeek's MoE: layers from first_k_dense_replace on are sparse; n_shared_experts experts of
  // moe_intermediate_size each every token goes through (one ungated MLP,
  // shared_expert_intermediate_size wide); the routed weights times routed_scaling_factor.
  // V2's topk_method: "greedy", or "group_limited_greedy" over n_group groups, topk_group kept
  // (V3 always limits its groups so, scoring each by its two best and with a bias).
  int64_t n_shared_experts = 0;
  int64_t first_k_dense_replace = 0;
  double routed_scaling_factor = 1.0;
  std::string topk_method = "greedy";
  int64_t n_group = 0;
  int64_t topk_group = 0;
  /// Not part of config.json: the fine-tuning's LoRA adapters (deepspeed::linear) on the decoder
  /// projections whose names contain one of lora->target_mods; none by default.
  std::optional<linear::LoRAConfig> lora;

  /// Whether q/k/v_proj have biases (attention_bias, or always in Qwen2 and Qwen2-MoE).
  bool qkv_bias() const {
    return attention_bias || model_type == "qwen2" || model_type == "qwen2_moe";
  }
  /// Qwen2-MoE and Qwen3-MoE: the sparse layers' MLP is `mlp` (Mixtral's `block_sparse_moe`),
  /// chosen by decoder_sparse_step and mlp_only_layers, its experts' projections named
  /// gate_proj/up_proj/down_proj (Mixtral's w1/w3/w2).
  bool qwen_moe() const { return model_type == "qwen2_moe" || model_type == "qwen3_moe"; }
  /// Gemma's decoder: the embeddings times sqrt(hidden_size) in the model dtype, each RMSNorm
  /// scaling by (1 + weight) in fp32, the MLP's gate through tanh-approximated GELU.
  bool gemma() const { return model_type == "gemma" || gemma2() || gemma3(); }
  bool gemma2() const { return model_type == "gemma2"; }
  bool gemma3() const { return model_type == "gemma3_text"; }
  /// Gemma 2's and 3's layer: a norm after the attention (post_attention_layernorm) and around
  /// the MLP (pre_ and post_feedforward_layernorm).
  bool sandwich_norms() const { return gemma2() || gemma3(); }
  /// Whether layer `index` is a sliding one: sliding_layers says, else every layer when there is
  /// a window, Gemma 2's of even index only.
  bool is_sliding_layer(int64_t index) const {
    if (!sliding_layers.empty()) return sliding_layers.at(static_cast<size_t>(index));
    return sliding_window > 0 && !(gemma2() && index % 2 == 1);
  }
  /// The window of layer `index`'s attention (-1: none).
  int64_t layer_sliding_window(int64_t index) const {
    return is_sliding_layer(index) ? sliding_window : -1;
  }
  /// Gemma 3: whether layer `index` rotates with rope_local_theta.
  bool rotates_locally(int64_t index) const {
    return rope_local_theta > 0 && !sliding_layers.empty() && is_sliding_layer(index);
  }
  /// Whether each query and key head goes through an RMSNorm before the rotation (Qwen3).
  bool qk_norm() const {
    return model_type == "qwen3" || model_type == "qwen3_moe" || gemma3();
  }
  /// DeepSeek-V2 and V3: multi-head latent attention, DeepSeek's MoE blocks.
  bool deepseek() const { return model_type == "deepseek_v2" || model_type == "deepseek_v3"; }
  /// Whether the experts' projections are named gate_proj/up_proj/down_proj (Mixtral's w1/w3/w2)
  /// and the sparse block `mlp` (Mixtral's `block_sparse_moe`).
  bool experts_named_as_mlp() const { return qwen_moe() || deepseek(); }
  /// Whether layer `index`'s MLP is a sparse MoE block (Qwen3MoeDecoderLayer's rule).
  bool is_sparse_layer(int64_t index) const;
  /// The features of each head the rotary embedding turns: transformers' int(head_dim *
  /// partial_rotary_factor).
  int64_t rotary_dim() const {
    return static_cast<int64_t>(static_cast<double>(head_dim) * partial_rotary_factor);
  }
  /// DeepSeek: the features of each head's query and key.
  int64_t qk_head_dim() const { return qk_nope_head_dim + head_dim; }
  /// The SwiGLU width of each expert.
  int64_t expert_intermediate_size() const {
    return moe_intermediate_size > 0 ? moe_intermediate_size : intermediate_size;
  }

  /// From a GGUF file's metadata (general.architecture "llama" — a Mixtral when it has
  /// .expert_count —, "qwen2", "qwen3", "qwen2moe", "qwen3moe" or "phi3", whose
  /// .rope.scaling.original_context_length, .rope.scaling.attn_factor,
  /// .attention.sliding_window and rope_factors_short/long.weight tensors are read too, or
  /// "gemma", "gemma2" (.attn_logit_softcapping, .final_logit_softcapping,
  /// .attention.sliding_window) or "gemma3" (.final_logit_softcapping,
  /// .attention.sliding_window), with llama.cpp's rules for what those files do not say: see
  /// read_gemma_gguf in the .cpp;
  /// {arch}.block_count, .embedding_length, .feed_forward_length, .attention.key_length,
  /// .expert_count, .expert_used_count, .expert_feed_forward_length,
  /// .expert_shared_feed_forward_length,
  /// .attention.head_count(_kv), .rope.freq_base, .attention.layer_norm_rms_epsilon,
  /// .context_length, .vocab_size or the token list's length, .rope.dimension_count,
  /// .rope.scaling.type "none"/"linear" with .rope.scaling.factor, or the older
  /// .rope.scale_linear) and its tensor table (tied when there is no output.weight; the
  /// rope_freqs.weight divisors of a Llama 3.1/3.2 conversion, see RopeScaling). Throws
  /// ModelFileError naming the file and key when general.architecture is another or a key is
  /// missing or inconsistent, NotSupportedError for yarn and other scaling types.
  static LlamaConfig from_gguf(const GgufFile& file);
  /// From a Hugging Face config.json (model_type "llama"; "mistral" with MistralConfig's
  /// defaults: sliding_window 4096 when absent, none when null; "qwen2" with Qwen2Config's:
  /// use_sliding_window is refused, its head size is hidden_size / heads; "mixtral", "qwen3",
  /// "qwen3_moe", "qwen2_moe", "phi3", "gemma" with their configs' defaults; longrope on Phi-3
  /// only; Gemma's hidden_activation tanh-approximated GELU, no rope scaling). The
  /// rotary base and scaling come from rope_theta and rope_scaling, or from transformers 5's
  /// rope_parameters; `path` names the file in errors.
  static LlamaConfig from_hf_json(const nlohmann::json& json, const std::string& path);
  /// The config.json that transformers' LlamaForCausalLM (Mistral-, Qwen2ForCausalLM) loads.
  nlohmann::json to_hf_json() const;
  /// Throws ModelFileError (naming `source`) unless the sizes fit together.
  void validate(const std::string& source) const;
};

}  // namespace deepspeed::examples

// Llama decoder implementation (see llama_model.h). The arithmetic follows transformers'
// modeling_llama (eager attention): RMSNorm in fp32, rotate-half RoPE with cos/sin in fp32,
// softmax in fp32, key/value heads repeated for grouped-query attention.
#include "llama_model.h"

#include <cmath>
#include <limits>
#include <set>

#include <torch/nn/functional/loss.h>
#include <torch/torch.h>

#include "deepspeed/checkpointing.h"
#include "decoder_ops.h"
#include "gguf_file.h"
#include "mla_attention.h"
#include "util/check.h"

namespace deepspeed::examples {
namespace {

torch::nn::Linear linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// DeepseekV2TopkRouter's and DeepseekV3TopkRouter's routing: V2 softmax, its k weights as they
// are, optionally within the topk_group best of n_group groups each scored by its best expert;
// V3 sigmoid, groups scored by their two best, a score correction bias, renormalised with
// norm_topk_prob. Both scale the weights by routed_scaling_factor.
void set_deepseek_routing(const LlamaConfig& cfg, moe::TokenChoiceOptions* o) {
  const bool v3 = cfg.model_type == "deepseek_v3";
  o->score_func = v3 ? "sigmoid" : "softmax";
  o->route_norm = v3 && cfg.norm_topk_prob;
  o->route_scale = cfg.routed_scaling_factor;
  o->score_correction_bias = v3;
  if (v3 || cfg.topk_method == "group_limited_greedy") {
    o->num_expert_groups = cfg.n_group;
    o->num_limited_groups = cfg.topk_group;
    o->group_score_func = v3 ? "top2_sum" : "max";
  }
}

// Copies the pretrained value of each parameter of `module` (named prefix + local name) from
// `weights`, or initialises it the way transformers' LlamaPreTrainedModel does. A LoRA
// projection's base weight goes through load_base_weight (its shard when sharded); its adapters
// keep their LoRA initialisation.
void fill_parameters(torch::nn::Module& module, const std::string& prefix,
                     const LlamaWeightSource& weights, const LlamaConfig& cfg) {
  torch::NoGradGuard no_grad;
  std::set<const c10::TensorImpl*> done;
  for (const auto& item : module.named_modules("", /*include_self=*/false)) {
    auto* lora = dynamic_cast<linear::OptimizedLinearImpl*>(item.value().get());
    if (lora == nullptr || !lora->lora_enabled()) continue;
    const std::string name = prefix + item.key();
    torch::Tensor full =
        weights ? weights(name + ".weight")
                : torch::empty({lora->output_dim(), lora->input_dim()}).normal_(0.0, 0.02);
    lora->load_base_weight(full, name);
    for (const auto& p : lora->parameters()) done.insert(p.unsafeGetTensorImpl());
    if (lora->bias.defined()) {
      if (!weights) {
        lora->bias.zero_();
        continue;
      }
      const torch::Tensor b = weights(name + ".bias");
      DS_CHECK(b.sizes() == lora->bias.sizes(), ModelFileError, "tensor '", name, ".bias' has "
               "shape ", b.sizes(), "; the model config expects ", lora->bias.sizes());
      lora->bias.copy_(b);
    }
  }
  for (auto& item : module.named_parameters()) {
    torch::Tensor& p = item.value();
    if (done.count(p.unsafeGetTensorImpl())) continue;
    const std::string name = prefix + item.key();
    if (weights && p.dim() == 3) {
      // A sparse MoE block's experts, stacked: transformers names each expert's projection.
      for (int64_t e = 0; e < p.size(0); ++e) {
        const std::string expert = hf_expert_name(cfg, name, e);
        torch::Tensor w = weights(expert);
        DS_CHECK(w.sizes() == p[e].sizes(), ModelFileError, "tensor '", expert, "' has shape ",
                 w.sizes(), "; the model config expects ", p[e].sizes());
        p[e].copy_(w);
      }
    } else if (weights) {
      torch::Tensor w = weights(name);
      DS_CHECK(w.sizes() == p.sizes(), ModelFileError, "tensor '", name, "' has shape ", w.sizes(),
               "; the model config expects ", p.sizes());
      p.copy_(w);
    } else if (name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0) {
      p.zero_();  // transformers zeroes Linear biases
    } else if (p.dim() == 1) {
      p.fill_(cfg.gemma() ? 0.0 : 1.0);  // RMSNorm weights: the identity (Gemma's an offset)
    } else {
      p.normal_(0.0, 0.02);
    }
  }
  // DeepSeek-V3's router bias is a buffer, zero unless the file gives it.
  for (auto& item : module.named_buffers()) {
    const std::string name = prefix + item.key();
    if (name.find("e_score_correction_bias") == std::string::npos) continue;
    if (!weights) {
      item.value().zero_();
      continue;
    }
    const torch::Tensor b = weights(name);
    DS_CHECK(b.sizes() == item.value().sizes(), ModelFileError, "tensor '", name, "' has shape ",
             b.sizes(), "; the model config expects ", item.value().sizes());
    item.value().copy_(b);
  }
}

}  // namespace

std::string hf_expert_name(const LlamaConfig& cfg, const std::string& stacked, int64_t expert) {
  const auto dot = stacked.rfind('.');
  std::string w = stacked.substr(dot + 1);
  if (cfg.experts_named_as_mlp()) {
    w = w == "w1" ? "gate_proj" : w == "w2" ? "down_proj" : w == "w3" ? "up_proj" : w;
  }
  return stacked.substr(0, dot) + "." + std::to_string(expert) + "." + w + ".weight";
}

at::Tensor router_load_balancing_loss(const std::vector<at::Tensor>& router_logits,
                                      int64_t num_experts, int64_t top_k) {
  const at::Tensor probs = at::softmax(at::cat(router_logits, 0), -1);  // [N, E]
  const at::Tensor chosen = std::get<1>(probs.topk(top_k, -1));          // [N, k]
  const at::Tensor tokens_per_expert =
      at::one_hot(chosen, num_experts).to(at::kFloat).mean(0);  // [k, E]
  const at::Tensor prob_per_expert = probs.mean(0);            // [E]
  return (tokens_per_expert * prob_per_expert.unsqueeze(0)).sum() * num_experts;
}

RmsNormImpl::RmsNormImpl(int64_t dim, double eps, bool offset_from_one)
    : eps_(eps), offset_from_one_(offset_from_one) {
  weight = register_parameter("weight", offset_from_one ? torch::zeros({dim}) : torch::ones({dim}));
}

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  auto h = x.to(torch::kFloat);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  if (offset_from_one_) return (h * (weight.to(torch::kFloat) + 1.0)).to(x.scalar_type());
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& cfg, const std::string& prefix,
                                       int64_t layer)
    : n_head_(cfg.num_attention_heads),
      n_kv_head_(cfg.num_key_value_heads),
      head_dim_(cfg.head_dim),
      sliding_window_(cfg.layer_sliding_window(layer)),
      // Gemma 2's query_pre_attn_scalar ** -0.5, as Python computes it.
      scaling_(cfg.query_pre_attn_scalar > 0 ? std::pow(cfg.query_pre_attn_scalar, -0.5)
                                             : 1.0 / std::sqrt(static_cast<double>(cfg.head_dim))),
      softcap_(cfg.attn_logit_softcapping) {
  const int64_t hidden = cfg.hidden_size;
  const int64_t q_out = n_head_ * head_dim_, kv_out = n_kv_head_ * head_dim_;
  const bool qkv_bias = cfg.qkv_bias(), o_bias = cfg.attention_bias;
  const auto proj = [&](const char* name, int64_t in, int64_t out, bool bias) {
    return register_module(name, decoder_projection(cfg, prefix + name, in, out, bias));
  };
  q_proj = proj("q_proj", hidden, q_out, qkv_bias);
  k_proj = proj("k_proj", hidden, kv_out, qkv_bias);
  v_proj = proj("v_proj", hidden, kv_out, qkv_bias);
  o_proj = proj("o_proj", q_out, hidden, o_bias);
  if (cfg.qk_norm()) {
    q_norm = register_module("q_norm", RmsNorm(head_dim_, cfg.rms_norm_eps, cfg.gemma()));
    k_norm = register_module("k_norm", RmsNorm(head_dim_, cfg.rms_norm_eps, cfg.gemma()));
  }
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                          const torch::Tensor& sin, torch::Tensor* past_k,
                                          torch::Tensor* past_v) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = q_proj(x).view({B, T, n_head_, head_dim_});
  auto k = k_proj(x).view({B, T, n_kv_head_, head_dim_});
  if (q_norm) {  // Qwen3, Gemma 3: each head normalised before the rotation
    q = q_norm(q);
    k = k_norm(k);
  }
  q = q.transpose(1, 2);  // [B, H, T, hd]
  k = k.transpose(1, 2);
  auto v = v_proj(x).view({B, T, n_kv_head_, head_dim_}).transpose(1, 2);
  const auto c = cos.to(x.scalar_type()), s = sin.to(x.scalar_type());
  q = rotate(q, c, s);
  k = rotate(k, c, s);
  if (past_k != nullptr) {
    if (past_k->defined()) {
      k = torch::cat({*past_k, k}, 2);
      v = torch::cat({*past_v, v}, 2);
    }
    *past_k = k;
    *past_v = v;
  }
  const int64_t S = k.size(2), rep = n_head_ / n_kv_head_;
  if (rep > 1) {  // grouped-query attention: each key/value head serves `rep` query heads
    k = k.unsqueeze(2).expand({B, n_kv_head_, rep, S, head_dim_}).reshape({B, n_head_, S, head_dim_});
    v = v.unsqueeze(2).expand({B, n_kv_head_, rep, S, head_dim_}).reshape({B, n_head_, S, head_dim_});
  }
  const auto y = causal_attention(q, k, v, scaling_, sliding_window_, softcap_);
  return o_proj(y.transpose(1, 2).reshape({B, T, n_head_ * head_dim_}));
}

LlamaMlpImpl::LlamaMlpImpl(const LlamaConfig& cfg, const std::string& prefix, int64_t width)
    : gelu_tanh_(cfg.gemma()) {
  const int64_t hidden = cfg.hidden_size, inner = width > 0 ? width : cfg.intermediate_size;
  const bool bias = cfg.mlp_bias;
  const auto proj = [&](const char* name, int64_t in, int64_t out) {
    return register_module(name, decoder_projection(cfg, prefix + name, in, out, bias));
  };
  gate_proj = proj("gate_proj", hidden, inner);
  up_proj = proj("up_proj", hidden, inner);
  down_proj = proj("down_proj", inner, hidden);
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  const auto gate = gate_proj(x);
  return down_proj((gelu_tanh_ ? torch::gelu(gate, "tanh") : torch::silu(gate)) * up_proj(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& cfg, int64_t index,
                                             const LlamaWeightSource& weights)
    : index_(index) {
  const std::string prefix = "model.layers." + std::to_string(index) + ".";
  input_layernorm = register_module("input_layernorm",
                                    RmsNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma()));
  if (cfg.deepseek()) {
    latent_attn = register_module(
        "self_attn", std::make_shared<MultiLatentAttentionImpl>(cfg, prefix + "self_attn."));
  } else {
    self_attn = register_module("self_attn", LlamaAttention(cfg, prefix + "self_attn.", index));
  }
  post_attention_layernorm =
      register_module("post_attention_layernorm",
                      RmsNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma()));
  if (cfg.sandwich_norms()) {
    pre_feedforward_layernorm = register_module(
        "pre_feedforward_layernorm", RmsNorm(cfg.hidden_size, cfg.rms_norm_eps, true));
    post_feedforward_layernorm = register_module(
        "post_feedforward_layernorm", RmsNorm(cfg.hidden_size, cfg.rms_norm_eps, true));
  }
  if (cfg.is_sparse_layer(index)) {
    // MixtralSparseMoeBlock's and Qwen3MoeSparseMoeBlock's routing: softmax in fp32, the top k,
    // renormalised (Qwen3-MoE: only with norm_topk_prob).
    moe::TokenChoiceOptions o;
    o.num_experts = cfg.num_local_experts;
    o.top_k = cfg.num_experts_per_tok;
    o.route_norm = cfg.norm_topk_prob;
    if (cfg.deepseek()) set_deepseek_routing(cfg, &o);
    sparse_moe = register_module(
        cfg.experts_named_as_mlp() ? "mlp" : "block_sparse_moe",
        moe::TokenChoiceMoE(cfg.hidden_size, cfg.expert_intermediate_size(), o));
    sparse_moe->set_keep_router_logits(cfg.output_router_logits);
    if (cfg.deepseek() && cfg.shared_expert_intermediate_size > 0) {
      shared_expert = sparse_moe->register_module(
          "shared_experts",
          LlamaMlp(cfg, prefix + "mlp.shared_experts.", cfg.shared_expert_intermediate_size));
    } else if (cfg.shared_expert_intermediate_size > 0) {
      shared_expert = sparse_moe->register_module(
          "shared_expert",
          LlamaMlp(cfg, prefix + "mlp.shared_expert.", cfg.shared_expert_intermediate_size));
      shared_expert_gate =
          sparse_moe->register_module("shared_expert_gate", linear(cfg.hidden_size, 1));
    }
  } else {
    mlp = register_module("mlp", LlamaMlp(cfg, prefix + "mlp."));
  }
  fill_parameters(*this, prefix, weights, cfg);
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                             const torch::Tensor& sin, LlamaKvCache* cache) {
  torch::Tensor* past_k = nullptr;
  torch::Tensor* past_v = nullptr;
  if (cache != nullptr) {
    past_k = &cache->keys.at(static_cast<size_t>(index_));
    past_v = &cache->values.at(static_cast<size_t>(index_));
  }
  if (pre_feedforward_layernorm) {  // Gemma2DecoderLayer, Gemma3DecoderLayer
    auto h = x + post_attention_layernorm(self_attn(input_layernorm(x), cos, sin, past_k, past_v));
    return h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h)));
  }
  const auto attended = input_layernorm(x);
  auto h = x + (latent_attn ? latent_attn->forward(attended, cos, sin, past_k, past_v)
                            : self_attn(attended, cos, sin, past_k, past_v));
  const auto normed = post_attention_layernorm(h);
  if (!sparse_moe) return h + mlp(normed);
  auto out = sparse_moe(normed);
  if (shared_expert_gate) {  // Qwen2MoeSparseMoeBlock's tail
    out = out + torch::sigmoid(shared_expert_gate(normed)) * shared_expert(normed);
  } else if (shared_expert) {  // DeepseekV3MoE's
    out = out + shared_expert(normed);
  }
  return h + out;
}

LlamaModelImpl::LlamaModelImpl(const LlamaConfig& cfg, const LlamaWeightSource& weights) : cfg_(cfg) {
  cfg.validate("model config");
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(cfg.vocab_size, cfg.hidden_size));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    units.push_back(std::make_shared<zero::Unit<LlamaDecoderLayerImpl>>(cfg, i, weights));
    layers->push_back(units.back());
  }
  norm = register_module("norm", RmsNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.gemma()));
  fill_parameters(*embed_tokens, "model.embed_tokens.", weights, cfg);
  fill_parameters(*norm, "model.norm.", weights, cfg);
  rope_.emplace(cfg.rope_scaling, cfg.rope_theta, cfg.rotary_dim(), cfg.max_position_embeddings);
  // Gemma 3's sliding layers rotate with a base of their own, unscaled.
  if (cfg.rope_local_theta > 0) {
    rope_local_.emplace(RopeScaling{}, cfg.rope_local_theta, cfg.rotary_dim(),
                        cfg.max_position_embeddings);
  }
}

void LlamaModelImpl::set_activation_checkpointing(bool on) { activation_checkpointing_ = on; }

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& ids, LlamaKvCache* cache) {
  const int64_t T = ids.size(1);
  int64_t start = 0;
  if (cache != nullptr) {
    if (cache->keys.empty()) {
      cache->keys.resize(static_cast<size_t>(cfg_.num_hidden_layers));
      cache->values.resize(static_cast<size_t>(cfg_.num_hidden_layers));
    }
    start = cache->length();
  }
  // Dynamic rope scaling stretches the rotation past the context instead.
  DS_CHECK(start + T <= cfg_.max_position_embeddings || rope_->extends_context(), UsageError,
           "sequence of ", start + T, " tokens exceeds the model's context length "
           "(max_position_embeddings ", cfg_.max_position_embeddings, ")");
  const auto pos = torch::arange(start, start + T, torch::kLong).to(torch::kFloat);
  // cos and sin [T, hd] of the positions of ids.
  const auto rotation = [&](RotaryFrequencies& rope) {
    auto freqs = torch::outer(pos, rope.for_length(start + T));  // [T, hd/2]
    auto emb = torch::cat({freqs, freqs}, -1);
    auto cos = emb.cos(), sin = emb.sin();
    if (rope.attention_scaling() != 1.0) {  // yarn: transformers scales both
      cos = cos * rope.attention_scaling();
      sin = sin * rope.attention_scaling();
    }
    return std::make_pair(cos, sin);
  };
  const auto global = rotation(*rope_);
  const auto local = rope_local_ ? rotation(*rope_local_) : global;
  auto x = embed_tokens(ids);
  // GemmaModel: the embeddings times sqrt(hidden_size), the factor first rounded to their dtype.
  if (cfg_.gemma()) {
    x = x * torch::scalar_tensor(std::sqrt(static_cast<double>(cfg_.hidden_size)), x.options());
  }
  const bool checkpoint = activation_checkpointing_ && cache == nullptr && torch::GradMode::is_enabled();
  router_logits_.clear();
  for (size_t i = 0; i < units.size(); ++i) {
    const auto& layer = units[i];
    const auto& rotated = cfg_.rotates_locally(static_cast<int64_t>(i)) ? local : global;
    const torch::Tensor cos = rotated.first, sin = rotated.second;
    const bool keeps_logits = cfg_.output_router_logits && layer->sparse_moe;
    if (checkpoint && keeps_logits) {
      // The router logits leave the checkpointed layer as its second output: those the block
      // keeps from a forward without a graph would give the load-balancing loss no path to the
      // router. Captured by value: the function is kept until the backward recomputes it.
      auto out = checkpointing::checkpoint(
          [layer, cos, sin](const std::vector<torch::Tensor>& in) {
            auto h = layer->forward(in[0], cos, sin, nullptr);
            return std::vector<torch::Tensor>{h, layer->sparse_moe->router_logits()};
          },
          std::vector<torch::Tensor>{x});
      x = out[0];
      router_logits_.push_back(out[1]);
    } else if (checkpoint) {
      x = checkpointing::checkpoint(
          [layer, cos, sin](const torch::Tensor& h) {
            return layer->forward(h, cos, sin, nullptr);
          },
          x);
    } else {
      x = layer->forward(x, cos, sin, cache);
      if (keeps_logits) router_logits_.push_back(layer->sparse_moe->router_logits());
    }
  }
  return norm(x);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaConfig& cfg, const LlamaWeightSource& weights)
    : cfg_(cfg) {
  model = register_module("model", LlamaModel(cfg, weights));
  if (!cfg.tie_word_embeddings) {
    lm_head = register_module("lm_head", linear(cfg.hidden_size, cfg.vocab_size));
    fill_parameters(*lm_head, "lm_head.", weights, cfg);
  }
}

torch::Tensor LlamaForCausalLMImpl::output_weight() const {
  return cfg_.tie_word_embeddings ? model->embed_tokens->weight : lm_head->weight;
}

torch::Tensor LlamaForCausalLMImpl::output_logits(const torch::Tensor& h) const {
  auto lg = torch::matmul(h, output_weight().t());
  const double cap = cfg_.final_logit_softcapping;
  if (cap > 0) lg = torch::tanh(lg / cap) * cap;  // Gemma 2, in the model's dtype as transformers
  return lg;
}

torch::Tensor LlamaForCausalLMImpl::logits(const torch::Tensor& ids, LlamaKvCache* cache) {
  return output_logits(model->forward(ids, cache)).to(torch::kFloat);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& ids, const torch::Tensor& targets) {
  torch::Tensor loss;
  if (lm_loss_ == LmLoss::kFused) {
    LinearCrossEntropyOptions fused;
    fused.logit_softcap = cfg_.final_logit_softcapping;  // Gemma 2's, on each block of logits
    loss = linear_cross_entropy(model->forward(ids), output_weight(), targets, fused);
  } else if (lm_loss_ == LmLoss::kChunked) {
    auto lg = output_logits(model->forward(ids));
    loss = chunked_cross_entropy(lg.view({-1, lg.size(-1)}), targets.reshape({-1}));
  } else {
    auto lg = logits(ids);
    loss = torch::nn::functional::cross_entropy(lg.view({-1, lg.size(-1)}), targets.reshape({-1}));
  }
  const auto& router_logits = model->router_logits();
  if (router_logits.empty()) return loss;
  return loss + cfg_.router_aux_loss_coef *
                    router_load_balancing_loss(router_logits, cfg_.num_local_experts,
                                               cfg_.num_experts_per_tok);
}

}  // namespace deepspeed::examples

// LlamaConfig from GGUF metadata or config.json, and back (see llama_config.h).
#include "llama_config.h"

#include <cmath>

#include "config_json.h"
#include "deepseek_config.h"
#include "deepseek_gguf.h"
#include "gguf_file.h"
#include "util/check.h"

namespace deepspeed::examples {

int64_t json_int(const nlohmann::json& j, const char* key, const std::string& path) {
  DS_CHECK(j.contains(key), ModelFileError, path, ": '", key, "' is missing");
  DS_CHECK(j.at(key).is_number_integer(), ModelFileError, path, ": '", key, "' is ",
           j.at(key).type_name(), "; expected an integer");
  return j.at(key).get<int64_t>();
}

int64_t int_or(const nlohmann::json& j, const char* key, const std::string& path,
               int64_t fallback) {
  return j.contains(key) && !j.at(key).is_null() ? json_int(j, key, path) : fallback;
}

namespace {

// llama.cpp's metadata for a stretched context: rope.scaling.type and .factor (older files:
// rope.scale_linear), or for Llama 3.1/3.2 the tensor rope_freqs.weight with one divisor per
// frequency.
RopeScaling gguf_rope_scaling(const GgufFile& f, const std::string& p, const LlamaConfig& c) {
  RopeScaling s;
  std::string type = f.has(p + "rope.scaling.type") ? f.get_string(p + "rope.scaling.type") : "";
  if (type.empty() && f.has(p + "rope.scale_linear")) {
    s.rope_type = "linear";
    s.factor = f.get_float(p + "rope.scale_linear");
  } else if (type == "linear") {
    s.rope_type = "linear";
    s.factor = f.get_float(p + "rope.scaling.factor");
  } else {
    DS_CHECK(type.empty() || type == "none", NotSupportedError, "GGUF file ", f.path(),
             ": metadata '", p, "rope.scaling.type' is '", type, "'; finetune_llama reads "
             "'none' and 'linear' (llama.cpp's yarn differs from transformers')");
  }
  if (f.find_tensor("rope_freqs.weight") != nullptr) {
    DS_CHECK(s.is_default(), ModelFileError, "GGUF file ", f.path(), ": both linear rope scaling "
             "and the tensor rope_freqs.weight are present");
    const at::Tensor t = f.load_tensor("rope_freqs.weight", at::kFloat).contiguous();
    std::vector<float> factors(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
    s = RopeScaling::from_gguf_freq_factors(std::move(factors), c.rope_theta, c.head_dim);
  }
  return s;
}

// llama.cpp's Phi-3 (its converter's Phi3MiniModel): Phi3Config's context defaults, the
// pretraining context as rope.scaling.original_context_length, the rotated share of each head as
// rope.dimension_count (Phi-4-mini's partial_rotary_factor), longrope's factors as the tensors
// rope_factors_short.weight and rope_factors_long.weight with their attention factor as
// rope.scaling.attn_factor, and the sliding window (0: none). The window is kept as the model's
// config.json has it, as finetune_llama reads that folder (llama.cpp runs Phi-3 without it for
// now, transformers' GGUF loader drops it).
void read_phi3_gguf(const GgufFile& f, const std::string& p, LlamaConfig* c) {
  // Phi3Config's defaults; the token ids are the tokenizer metadata's, as for every GGUF.
  c->max_position_embeddings = 4096;
  c->original_max_position_embeddings = 4096;
  if (f.has(p + "context_length")) c->max_position_embeddings = f.get_int(p + "context_length");
  const std::string original_key = p + "rope.scaling.original_context_length";
  if (f.has(original_key)) c->original_max_position_embeddings = f.get_int(original_key);
  DS_CHECK(c->original_max_position_embeddings > 0, ModelFileError, "GGUF file ", f.path(),
           ": metadata '", original_key, "' is ", c->original_max_position_embeddings,
           "; expected a positive integer");
  const std::string window_key = p + "attention.sliding_window";
  if (f.has(window_key)) {
    const int64_t window = f.get_int(window_key);
    DS_CHECK(window >= 0, ModelFileError, "GGUF file ", f.path(), ": metadata '", window_key,
             "' is ", window, "; expected a positive integer or 0 (none)");
    c->sliding_window = window > 0 ? window : -1;
  }
  const std::string type_key = p + "rope.scaling.type";
  DS_CHECK(!f.has(type_key) || f.get_string(type_key) == "none", NotSupportedError, "GGUF file ",
           f.path(), ": metadata '", type_key, "' is '",
           f.has(type_key) ? f.get_string(type_key) : "", "' on a 'phi3' model, whose scaling "
           "finetune_llama reads from the tensors rope_factors_short/long.weight");
  if (f.has(p + "rope.dimension_count")) {
    const int64_t rotated = f.get_int(p + "rope.dimension_count");
    DS_CHECK(rotated > 0 && rotated <= c->head_dim, ModelFileError, "GGUF file ", f.path(),
             ": metadata '", p, "rope.dimension_count' is ", rotated,
             "; expected 1..the head size (", c->head_dim, ")");
    // The factor transformers would read back (int(head_dim * factor) features rotated),
    // nudged up where the quotient rounds below.
    c->partial_rotary_factor = static_cast<double>(rotated) / static_cast<double>(c->head_dim);
    if (c->rotary_dim() < rotated) {
      c->partial_rotary_factor = std::nextafter(c->partial_rotary_factor, 2.0);
    }
  }
  const bool has_short = f.find_tensor("rope_factors_short.weight") != nullptr;
  const bool has_long = f.find_tensor("rope_factors_long.weight") != nullptr;
  DS_CHECK(has_short == has_long, ModelFileError, "GGUF file ", f.path(), ": tensor '",
           has_short ? "rope_factors_long.weight" : "rope_factors_short.weight",
           "' is missing; longrope needs both the short and the long factors");
  if (!has_short) return;
  const auto factors = [&](const char* name) {
    const at::Tensor t = f.load_tensor(name, at::kFloat).contiguous().to(at::kDouble);
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  };
  RopeScaling& s = c->rope_scaling;
  s.rope_type = "longrope";
  s.short_factor = factors("rope_factors_short.weight");
  s.long_factor = factors("rope_factors_long.weight");
  s.original_max_position_embeddings = c->original_max_position_embeddings;
  // Phi-3's attention factor follows from the two contexts (rope_scaling.h); a file that says
  // otherwise (the converter's "yarn" form) would rotate differently here.
  const std::string attn_key = p + "rope.scaling.attn_factor";
  if (f.has(attn_key)) {
    const double stretch = static_cast<double>(c->max_position_embeddings) /
                           static_cast<double>(c->original_max_position_embeddings);
    const double expected =
        stretch <= 1.0 ? 1.0
                       : std::sqrt(1.0 + std::log(stretch) /
                                             std::log(static_cast<double>(
                                                 c->original_max_position_embeddings)));
    const double given = f.get_float(attn_key);
    DS_CHECK(std::abs(given - expected) <= 1e-6 * expected, NotSupportedError, "GGUF file ",
             f.path(), ": metadata '", attn_key, "' is ", given, " but longrope's attention "
             "factor for ", c->max_position_embeddings, " positions over ",
             c->original_max_position_embeddings, " original ones is ", expected);
  }
}

// llama.cpp's Gemma, Gemma 2 and Gemma 3 (its converter's GemmaModel, Gemma2Model and
// Gemma3Model, and its loader's hyper-parameters). Gemma 2's soft caps and window, and Gemma 3's
// window and final cap, are metadata; what the file does not hold is llama.cpp's rule: Gemma 2
// slides on the layers of even index, with a window of 4096 and caps of 50 and 30 unless the
// file says otherwise; Gemma 3 slides (when it has a window) on five layers of each six, the
// sixth global, rotating the sliding ones with base 10000 unscaled; both scale the attention
// scores by head_size^-1/2, or by (hidden / heads)^-1/2 for the 27B models (46 and 62 layers),
// which is their query_pre_attn_scalar. Gemma 3's rotary base and scaling in the file are its
// global layers'. (The RMSNorm weights, stored plus one, are the weights reader's.)
void read_gemma_gguf(const GgufFile& f, const std::string& arch, const std::string& p,
                     LlamaConfig* c) {
  if (arch == "gemma") return;
  const bool large = c->num_hidden_layers == (arch == "gemma2" ? 46 : 62);
  c->query_pre_attn_scalar = large ? static_cast<double>(c->hidden_size / c->num_attention_heads)
                                   : static_cast<double>(c->head_dim);
  const std::string window_key = p + "attention.sliding_window";
  if (arch == "gemma2") {
    c->sliding_window = f.has(window_key) ? f.get_int(window_key) : 4096;
    c->attn_logit_softcapping = f.has(p + "attn_logit_softcapping")
                                    ? f.get_float(p + "attn_logit_softcapping")
                                    : 50.0;
    c->final_logit_softcapping = f.has(p + "final_logit_softcapping")
                                     ? f.get_float(p + "final_logit_softcapping")
                                     : 30.0;
    return;
  }
  if (f.has(p + "final_logit_softcapping")) {
    c->final_logit_softcapping = f.get_float(p + "final_logit_softcapping");
  }
  const int64_t window = f.has(window_key) ? f.get_int(window_key) : 0;
  if (window <= 0) return;  // every layer global
  c->sliding_window = window;
  c->rope_local_theta = 10000.0;
  for (int64_t i = 0; i < c->num_hidden_layers; ++i) c->sliding_layers.push_back(i % 6 < 5);
}

}  // namespace

LlamaConfig LlamaConfig::from_gguf(const GgufFile& f) {
  const std::string arch = f.get_string("general.architecture");
  const bool gemma = arch == "gemma" || arch == "gemma2" || arch == "gemma3";
  const bool deepseek = arch == "deepseek2";
  DS_CHECK(arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "qwen2moe" ||
               arch == "qwen3moe" || arch == "phi3" || gemma || deepseek,
           ModelFileError, "GGUF file ", f.path(), ": general.architecture is '", arch,
           "'; finetune_llama reads 'llama' (with experts: Mixtral), 'qwen2', 'qwen3', "
           "'qwen2moe', 'qwen3moe', 'phi3', 'gemma', 'gemma2', 'gemma3' and 'deepseek2' "
           "models");
  const std::string p = arch + ".";
  const bool qwen_moe = arch == "qwen2moe" || arch == "qwen3moe";
  const bool has_experts = f.has(p + "expert_count") && f.get_int(p + "expert_count") != 0;
  DS_CHECK(arch == "llama" || qwen_moe || deepseek || !has_experts, NotSupportedError, "GGUF file ",
           f.path(), ": ", p, "expert_count is ", f.get_int(p + "expert_count"),
           "; a '", arch, "' model has no experts here");
  // llama.cpp stores Mixtral as architecture 'llama' with experts.
  const bool mixtral = arch == "llama" && has_experts;
  LlamaConfig c;
  c.model_type = arch == "qwen3moe"   ? "qwen3_moe"
                 : arch == "qwen2moe" ? "qwen2_moe"
                 : arch == "gemma3"   ? "gemma3_text"
                 : mixtral            ? "mixtral"
                                      : arch;
  const bool phi3 = arch == "phi3";
  if (arch != "llama" && !phi3 && !gemma) {
    c.max_position_embeddings = 32768;  // the Qwen configs' default
  }
  if (gemma) c.max_position_embeddings = arch == "gemma3" ? 131072 : 8192;  // their configs'
  if (qwen_moe || mixtral) {
    // Every layer sparse, as llama.cpp runs them. It renormalises the k scores of Mixtral (which
    // always does) and of qwen3moe (transformers' GGUF loader sets norm_topk_prob for it), not
    // of qwen2moe (Qwen2MoeConfig's norm_topk_prob is false, and transformers keeps it).
    c.num_local_experts = f.get_int(p + "expert_count");
    c.num_experts_per_tok = f.get_int(p + "expert_used_count");
    if (qwen_moe) c.moe_intermediate_size = f.get_int(p + "expert_feed_forward_length");
    if (arch == "qwen2moe") {
      c.shared_expert_intermediate_size = f.get_int(p + "expert_shared_feed_forward_length");
    }
    c.norm_topk_prob = arch != "qwen2moe";
    DS_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_local_experts,
             ModelFileError, "GGUF file ", f.path(), ": ", p, "expert_used_count (",
             c.num_experts_per_tok, ") must be in 1..", p, "expert_count (",
             c.num_local_experts, ")");
  }
  c.num_hidden_layers = f.get_int(p + "block_count");
  c.hidden_size = f.get_int(p + "embedding_length");
  // A sparse model's dense width is used by no layer; llama.cpp's converter may leave it out.
  c.intermediate_size = qwen_moe && !f.has(p + "feed_forward_length")
                            ? c.moe_intermediate_size
                            : f.get_int(p + "feed_forward_length");
  // Mixtral's experts are intermediate_size wide; a converter may say so again per expert.
  DS_CHECK(!mixtral || !f.has(p + "expert_feed_forward_length") ||
               f.get_int(p + "expert_feed_forward_length") == c.intermediate_size,
           NotSupportedError, "GGUF file ", f.path(), ": metadata '", p,
           "expert_feed_forward_length' (", f.get_int(p + "expert_feed_forward_length"),
           ") differs from '", p, "feed_forward_length' (", c.intermediate_size,
           "); a Mixtral's experts are feed_forward_length wide");
  c.num_attention_heads = f.get_int(p + "attention.head_count");
  c.num_key_value_heads = f.has(p + "attention.head_count_kv")
                              ? f.get_int(p + "attention.head_count_kv")
                              : c.num_attention_heads;
  // DeepSeek's latent attention has head sizes of its own (deepseek_gguf.cpp).
  if (deepseek) read_deepseek_gguf(f, p, &c);
  if (!deepseek) {
    // Qwen3's heads are wider than embedding_length / head_count (llama.cpp's key_length).
    c.head_dim = f.has(p + "attention.key_length")
                     ? f.get_int(p + "attention.key_length")
                     : (c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0);
  }
  DS_CHECK(deepseek || !f.has(p + "attention.value_length") ||
               f.get_int(p + "attention.value_length") == c.head_dim,
           NotSupportedError, "GGUF file ", f.path(), ": metadata '", p,
           "attention.value_length' differs from the key head size ", c.head_dim);
  if (phi3) {
    read_phi3_gguf(f, p, &c);
  } else if (!deepseek && f.has(p + "rope.dimension_count")) {
    const int64_t rope_dim = f.get_int(p + "rope.dimension_count");
    DS_CHECK(rope_dim == c.head_dim, ModelFileError, "GGUF file ", f.path(), ": metadata '", p,
             "rope.dimension_count' is ", rope_dim, " but the head size (attention.key_length, "
             "or embedding_length / head_count) is ", c.head_dim,
             "; partial rotary embeddings are not supported");
  }
  if (f.has(p + "context_length")) c.max_position_embeddings = f.get_int(p + "context_length");
  if (f.has(p + "rope.freq_base")) c.rope_theta = f.get_float(p + "rope.freq_base");
  if (!phi3 && !deepseek) c.rope_scaling = gguf_rope_scaling(f, p, c);
  c.rms_norm_eps = f.get_float(p + "attention.layer_norm_rms_epsilon");
  if (gemma) read_gemma_gguf(f, arch, p, &c);

  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  DS_CHECK(embd != nullptr, ModelFileError, "GGUF file ", f.path(),
           ": tensor 'token_embd.weight' is missing");
  const int64_t embd_rows = embd->shape[0];
  c.vocab_size = f.has(p + "vocab_size") ? f.get_int(p + "vocab_size")
                                         : static_cast<int64_t>(f.get_array("tokenizer.ggml.tokens").size());
  DS_CHECK(c.vocab_size == embd_rows, ModelFileError, "GGUF file ", f.path(), ": vocabulary size ",
           c.vocab_size, " (metadata '", p, "vocab_size' or the tokenizer.ggml.tokens count) != "
           "the rows of tensor 'token_embd.weight' (", embd_rows, ")");
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos_token_id = f.get_int("tokenizer.ggml.bos_token_id");
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_token_id = f.get_int("tokenizer.ggml.eos_token_id");
  if (f.has("tokenizer.ggml.padding_token_id"))
    c.pad_token_id = f.get_int("tokenizer.ggml.padding_token_id");
  c.validate("GGUF file " + f.path());
  return c;
}

namespace {

// The router's load-balancing loss (output_router_logits, weighted router_aux_loss_coef); its
// training-time jitter is refused rather than ignored: the sparse blocks here have none.
void read_router(const nlohmann::json& j, const std::string& path, const char* experts_key,
                 LlamaConfig* c) {
  DS_CHECK(c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_local_experts,
           ModelFileError, path, ": num_experts_per_tok (", c->num_experts_per_tok,
           ") must be in 1..", experts_key, " (", c->num_local_experts, ")");
  c->output_router_logits = j.value("output_router_logits", false);
  if (j.contains("router_aux_loss_coef") && !j["router_aux_loss_coef"].is_null()) {
    DS_CHECK(j["router_aux_loss_coef"].is_number(), ModelFileError, path,
             ": router_aux_loss_coef is ", j["router_aux_loss_coef"].type_name(),
             "; expected a number");
    c->router_aux_loss_coef = j["router_aux_loss_coef"].get<double>();
  }
  DS_CHECK(j.value("router_jitter_noise", 0.0) == 0.0, NotSupportedError, path,
           ": router_jitter_noise is ", j.value("router_jitter_noise", 0.0),
           "; finetune_llama's routers have no jitter");
}

// MixtralConfig's expert keys.
void read_mixtral_experts(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  c->num_local_experts = int_or(j, "num_local_experts", path, 8);
  c->num_experts_per_tok = int_or(j, "num_experts_per_tok", path, 2);
  read_router(j, path, "num_local_experts", c);
}

// Qwen3MoeConfig's and Qwen2MoeConfig's expert keys (transformers 5 writes num_experts back as
// num_local_experts). Their routers divide the k scores by their sum only with norm_topk_prob,
// false by default; Qwen2-MoE's blocks add a gated shared expert.
void read_qwen_moe_experts(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  const bool qwen2 = c->model_type == "qwen2_moe";
  const char* count = j.contains("num_experts") ? "num_experts" : "num_local_experts";
  c->num_local_experts = int_or(j, count, path, qwen2 ? 60 : 128);
  c->num_experts_per_tok = int_or(j, "num_experts_per_tok", path, qwen2 ? 4 : 8);
  c->moe_intermediate_size = int_or(j, "moe_intermediate_size", path, qwen2 ? 1408 : 768);
  if (qwen2) {
    c->shared_expert_intermediate_size = int_or(j, "shared_expert_intermediate_size", path, 5632);
    DS_CHECK(c->shared_expert_intermediate_size > 0, ModelFileError, path,
             ": shared_expert_intermediate_size is ", c->shared_expert_intermediate_size,
             "; expected a positive integer");
  }
  c->norm_topk_prob = j.value("norm_topk_prob", false);
  c->decoder_sparse_step = int_or(j, "decoder_sparse_step", path, 1);
  DS_CHECK(c->decoder_sparse_step > 0, ModelFileError, path, ": decoder_sparse_step is ",
           c->decoder_sparse_step, "; expected a positive integer");
  if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
    const auto& layers = j["mlp_only_layers"];
    DS_CHECK(layers.is_array(), ModelFileError, path, ": mlp_only_layers is ",
             layers.type_name(), "; expected a list of layer indices");
    for (const auto& l : layers) {
      DS_CHECK(l.is_number_integer(), ModelFileError, path, ": mlp_only_layers holds ", l.dump(),
               "; expected layer indices");
      c->mlp_only_layers.push_back(l.get<int64_t>());
    }
  }
  DS_CHECK(c->moe_intermediate_size > 0 && c->num_local_experts >= 0, ModelFileError, path,
           ": moe_intermediate_size (", c->moe_intermediate_size, ") must be positive and ",
           count, " (", c->num_local_experts, ") not negative");
  if (c->num_local_experts > 0) read_router(j, path, count, c);
}

// Qwen2Config and Qwen3Config keep sliding_window only with use_sliding_window, which
// transformers applies to the layers from max_window_layers on.
void refuse_sliding_layers(const nlohmann::json& j, const std::string& path,
                           const std::string& type) {
  DS_CHECK(!j.value("use_sliding_window", false), NotSupportedError, path,
           ": use_sliding_window is true; finetune_llama's '", type, "' attends to every "
           "position");
  if (j.contains("layer_types") && j["layer_types"].is_array()) {
    for (const auto& t : j["layer_types"]) {
      DS_CHECK(t == "full_attention", NotSupportedError, path, ": layer_types holds ", t.dump(),
               "; finetune_llama's '", type, "' reads 'full_attention' layers only");
    }
  }
}

// The rotary base and scaling: transformers 5 keeps both in rope_parameters (and writes them
// back so); the Hub's configs and older transformers have rope_theta and rope_scaling.
void read_rope(const nlohmann::json& j, const std::string& path, double default_theta,
               LlamaConfig* c) {
  c->rope_theta = j.contains("rope_theta") ? j.at("rope_theta").get<double>() : default_theta;
  // transformers 4.49+ keeps partial_rotary_factor beside rope_theta; 5 also in rope_parameters.
  const auto factor = [&](const nlohmann::json& o, const std::string& where) {
    DS_CHECK(o["partial_rotary_factor"].is_number(), ModelFileError, path, ": ", where,
             "partial_rotary_factor is ", o["partial_rotary_factor"].type_name(),
             "; expected a number");
    return o["partial_rotary_factor"].get<double>();
  };
  if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null()) {
    c->partial_rotary_factor = factor(j, "");
  }
  if (!j.contains("rope_parameters") || j["rope_parameters"].is_null()) {
    if (j.contains("rope_scaling")) {
      c->rope_scaling = RopeScaling::from_hf_json(j["rope_scaling"], path);
    }
    return;
  }
  nlohmann::json rp = j["rope_parameters"];
  DS_CHECK(rp.is_object(), ModelFileError, path, ": rope_parameters is ", rp.type_name(),
           "; expected an object");
  DS_CHECK(!j.contains("rope_scaling") || j["rope_scaling"].is_null(), NotSupportedError, path,
           ": both rope_parameters and rope_scaling are set; keep one");
  if (rp.contains("rope_theta")) {
    DS_CHECK(rp["rope_theta"].is_number(), ModelFileError, path, ": rope_parameters.rope_theta "
             "is ", rp["rope_theta"].type_name(), "; expected a number");
    const double theta = rp["rope_theta"].get<double>();
    DS_CHECK(!j.contains("rope_theta") || theta == c->rope_theta, ModelFileError, path,
             ": rope_theta (", c->rope_theta, ") and rope_parameters.rope_theta (", theta,
             ") disagree");
    c->rope_theta = theta;
    rp.erase("rope_theta");
  }
  if (rp.contains("partial_rotary_factor")) {
    const double partial = factor(rp, "rope_parameters.");
    DS_CHECK(!j.contains("partial_rotary_factor") || partial == c->partial_rotary_factor,
             ModelFileError, path, ": partial_rotary_factor (", c->partial_rotary_factor,
             ") and rope_parameters.partial_rotary_factor (", partial, ") disagree");
    c->partial_rotary_factor = partial;
    rp.erase("partial_rotary_factor");
  }
  c->rope_scaling = RopeScaling::from_hf_json(rp, path, "rope_parameters");
}

// Phi3Config's keys beyond Llama's: the pretraining context longrope switches at (4096 by
// default), the sliding window (none unless set), and what finetune_llama's decoder leaves out,
// refused by name: dropout, another activation. (partial_rotary_factor is read_rope's.)
void read_phi3(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  c->original_max_position_embeddings = int_or(j, "original_max_position_embeddings", path, 4096);
  DS_CHECK(c->original_max_position_embeddings > 0, ModelFileError, path,
           ": original_max_position_embeddings is ", c->original_max_position_embeddings,
           "; expected a positive integer");
  if (j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    c->sliding_window = json_int(j, "sliding_window", path);
    DS_CHECK(c->sliding_window > 0, ModelFileError, path, ": sliding_window is ",
             c->sliding_window, "; expected a positive integer or null");
  }
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    DS_CHECK(!j.contains(key) || j[key].is_null() || (j[key].is_number() && j[key] == 0),
             NotSupportedError, path, ": ", key, " is ", j.value(key, nlohmann::json()).dump(),
             "; finetune_llama's 'phi3' trains without dropout");
  }
  DS_CHECK(j.value("hidden_act", std::string("silu")) == "silu", NotSupportedError, path,
           ": hidden_act is '", j.value("hidden_act", std::string()), "'; finetune_llama's MLP "
           "is SwiGLU (silu)");
}

// GemmaConfig's activation: `hidden_activation`, tanh-approximated GELU when null or absent
// (transformers then ignores `hidden_act`, as here); another one refused by name.
void read_gemma(const nlohmann::json& j, const std::string& path) {
  if (!j.contains("hidden_activation") || j["hidden_activation"].is_null()) return;
  DS_CHECK(j["hidden_activation"] == "gelu_pytorch_tanh", NotSupportedError, path,
           ": hidden_activation is ", j["hidden_activation"].dump(),
           "; finetune_llama's 'gemma' MLP is GeGLU with tanh-approximated GELU "
           "(gelu_pytorch_tanh)");
}

// Gemma2Config's keys beyond Gemma's, with its defaults: the score scale, the window (every
// other layer's; null: none) and the two soft caps (null: none). transformers 5's layer_types
// is read only when it names Gemma 2's own alternation.
void read_gemma2(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  const auto positive_or = [&](const char* key, double fallback) {
    if (!j.contains(key)) return fallback;
    if (j[key].is_null()) return 0.0;
    DS_CHECK(j[key].is_number() && j[key].get<double>() > 0, ModelFileError, path, ": ", key,
             " is ", j[key].dump(), "; expected a positive number or null");
    return j[key].get<double>();
  };
  c->query_pre_attn_scalar = positive_or("query_pre_attn_scalar", 256.0);
  DS_CHECK(c->query_pre_attn_scalar > 0, ModelFileError, path,
           ": query_pre_attn_scalar is null; expected a positive number");
  // Gemma3TextConfig caps nothing unless told.
  const bool gemma3 = c->gemma3();
  c->attn_logit_softcapping = positive_or("attn_logit_softcapping", gemma3 ? 0.0 : 50.0);
  c->final_logit_softcapping = positive_or("final_logit_softcapping", gemma3 ? 0.0 : 30.0);
  c->sliding_window = 4096;
  if (j.contains("sliding_window")) {
    c->sliding_window = j["sliding_window"].is_null() ? -1 : json_int(j, "sliding_window", path);
    DS_CHECK(c->sliding_window != 0, ModelFileError, path, ": sliding_window is 0");
  }
  if (gemma3) return;  // its layer_types are read_gemma3_layers'
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& types = j["layer_types"];
    bool alternating = types.is_array();
    for (size_t i = 0; alternating && i < types.size(); ++i) {
      alternating = types[i] == (i % 2 == 0 ? "sliding_attention" : "full_attention");
    }
    DS_CHECK(alternating, NotSupportedError, path, ": layer_types is ",
             types.dump().substr(0, 200), "; finetune_llama's 'gemma2' slides the window in the "
             "layers of even index, as Gemma2Config's default");
  }
}

// Gemma3TextConfig's layers, once num_hidden_layers is known: which slide (layer_types, else
// every layer but each sliding_window_pattern-th, 6 by default), and the two rotations: the
// global layers' rope_theta (1e6) and rope_scaling, the sliding layers' rope_local_base_freq
// (1e4) unscaled; or transformers 5's rope_parameters holding one object per layer type.
void read_gemma3_layers(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  DS_CHECK(!j.value("use_bidirectional_attention", false), NotSupportedError, path,
           ": use_bidirectional_attention is true; finetune_llama's decoder is causal");
  const int64_t n = c->num_hidden_layers;
  c->sliding_layers.assign(static_cast<size_t>(n), false);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& types = j["layer_types"];
    DS_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == n, ModelFileError, path,
             ": layer_types is ", types.dump().substr(0, 200), "; expected one entry for each of "
             "the ", n, " layers");
    for (int64_t i = 0; i < n; ++i) {
      const auto& t = types[static_cast<size_t>(i)];
      DS_CHECK(t == "sliding_attention" || t == "full_attention", NotSupportedError, path,
               ": layer_types[", i, "] is ", t.dump(), "; finetune_llama reads "
               "\"sliding_attention\" and \"full_attention\"");
      c->sliding_layers[static_cast<size_t>(i)] = t == "sliding_attention";
    }
  } else {
    const int64_t pattern = int_or(j, "sliding_window_pattern", path, 6);
    DS_CHECK(pattern > 0, ModelFileError, path, ": sliding_window_pattern is ", pattern);
    for (int64_t i = 0; i < n; ++i) c->sliding_layers[static_cast<size_t>(i)] = (i + 1) % pattern;
  }
  const bool per_type = j.contains("rope_parameters") && j["rope_parameters"].is_object() &&
                        j["rope_parameters"].contains("full_attention");
  if (!per_type) {
    read_rope(j, path, 1e6, c);
    c->rope_local_theta = j.contains("rope_local_base_freq") && !j["rope_local_base_freq"].is_null()
                              ? j["rope_local_base_freq"].get<double>()
                              : 1e4;
    return;
  }
  const auto& rp = j["rope_parameters"];
  read_rope({{"rope_parameters", rp["full_attention"]}}, path + " (rope_parameters.full_attention)",
            1e6, c);
  const auto local = rp.value("sliding_attention", nlohmann::json::object());
  const std::string local_type = local.value("rope_type", std::string("default"));
  DS_CHECK(local_type == "default", NotSupportedError, path,
           ": rope_parameters.sliding_attention.rope_type is '", local_type, "'; Gemma 3's "
           "sliding layers rotate unscaled here");
  c->rope_local_theta = local.value("rope_theta", 1e4);
}

int64_t json_token_id(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return -1;
  const auto& v = j.at(key);
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v.front().is_number_integer()) return v.front().get<int64_t>();
  return -1;
}

}  // namespace

LlamaConfig LlamaConfig::from_hf_json(const nlohmann::json& j, const std::string& path) {
  DS_CHECK(j.is_object(), ModelFileError, path, ": expected a JSON object");
  const std::string type = j.value("model_type", std::string());
  DS_CHECK(type == "llama" || type == "mistral" || type == "qwen2" || type == "mixtral" ||
               type == "qwen3" || type == "qwen3_moe" || type == "qwen2_moe" || type == "phi3" ||
               type == "gemma" || type == "gemma2" || type == "gemma3_text" ||
               type == "deepseek_v2" || type == "deepseek_v3",
           ModelFileError, path, ": model_type is '", type, "'; finetune_llama reads 'llama', "
           "'mistral', 'qwen2', 'qwen2_moe', 'mixtral', 'qwen3', 'qwen3_moe', 'phi3', 'gemma', "
           "'gemma2', 'gemma3_text', 'deepseek_v2' and 'deepseek_v3' models");
  const bool mixtral = type == "mixtral";
  const bool phi3 = type == "phi3";
  const bool gemma3 = type == "gemma3_text";
  const bool gemma = type == "gemma" || type == "gemma2" || gemma3;
  const bool mistral = type == "mistral" || mixtral;
  const bool qwen2 = type == "qwen2" || type == "qwen2_moe";
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3";
  LlamaConfig c;
  c.model_type = type;
  if (mistral) {
    // MistralConfig's (and MixtralConfig's) defaults where they differ from LlamaConfig's.
    c.max_position_embeddings = 4096 * 32;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
    c.sliding_window = mixtral ? -1 : 4096;
    if (j.contains("sliding_window")) {
      c.sliding_window = j["sliding_window"].is_null() ? -1 : json_int(j, "sliding_window", path);
      DS_CHECK(c.sliding_window != 0, ModelFileError, path, ": sliding_window is 0");
    }
    if (mixtral) read_mixtral_experts(j, path, &c);
  } else if (qwen2 || qwen3) {
    c.max_position_embeddings = 32768;  // Qwen2Config's and Qwen3Config's default
    refuse_sliding_layers(j, path, type);
    if (type == "qwen3_moe" || type == "qwen2_moe") read_qwen_moe_experts(j, path, &c);
  } else if (phi3) {
    // Phi3Config's defaults where they differ from LlamaConfig's.
    c.max_position_embeddings = 4096;
    c.rms_norm_eps = 1e-5;
    c.bos_token_id = 1;
    c.eos_token_id = 32000;
    c.pad_token_id = 32000;
    read_phi3(j, path, &c);
  } else if (gemma) {
    // GemmaConfig's defaults where they differ from LlamaConfig's.
    c.max_position_embeddings = 8192;
    c.bos_token_id = 2;
    c.eos_token_id = 1;
    c.pad_token_id = 0;
    if (gemma3) c.max_position_embeddings = 131072;
    read_gemma(j, path);
    if (type == "gemma2" || gemma3) read_gemma2(j, path, &c);
  } else if (deepseek) {
    // DeepseekV3Config's defaults where they differ from LlamaConfig's (V2's are Llama's).
    if (type == "deepseek_v3") {
      c.max_position_embeddings = 4096;
      c.bos_token_id = 0;
      c.eos_token_id = 1;
    } else {
      c.bos_token_id = 1;
      c.eos_token_id = 2;
    }
  } else {
    DS_CHECK(!j.contains("sliding_window") || j["sliding_window"].is_null(), NotSupportedError,
             path, ": sliding_window is set on a 'llama' model; finetune_llama reads it on "
             "'mistral' models");
  }
  c.vocab_size = json_int(j, "vocab_size", path);
  c.hidden_size = json_int(j, "hidden_size", path);
  c.intermediate_size = json_int(j, "intermediate_size", path);
  c.num_hidden_layers = json_int(j, "num_hidden_layers", path);
  c.num_attention_heads = json_int(j, "num_attention_heads", path);
  c.num_key_value_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                              ? json_int(j, "num_key_value_heads", path)
                              : c.num_attention_heads;
  // Qwen3Config's head_dim is 128 unless given (Qwen3MoeConfig has none: hidden / heads),
  // GemmaConfig's 256.
  const int64_t split_head = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() && !qwen2
                   ? json_int(j, "head_dim", path)
                   : (type == "qwen3" ? 128 : gemma ? 256 : split_head);
  // transformers' Qwen2 and Phi-3 take hidden_size / heads whatever head_dim says.
  DS_CHECK(!(qwen2 || phi3) || !j.contains("head_dim") || j["head_dim"].is_null() ||
               json_int(j, "head_dim", path) == c.head_dim,
           NotSupportedError, path, ": head_dim is ", j.value("head_dim", nlohmann::json()).dump(),
           " but a '", type, "' model's head size is hidden_size / num_attention_heads (",
           c.head_dim, ")");
  c.max_position_embeddings = j.value("max_position_embeddings", c.max_position_embeddings);
  if (deepseek) read_deepseek(j, path, &c);  // its head size is qk_rope_head_dim
  if (gemma3) {
    read_gemma3_layers(j, path, &c);
  } else {
    read_rope(j, path, mixtral ? 1e6 : c.rope_theta, &c);
  }
  // transformers' Mistral rotary embedding (4.x) reads no rope_scaling: refused, not ignored.
  DS_CHECK(!(mistral || (gemma && !gemma3)) || c.rope_scaling.is_default(), NotSupportedError,
           path,
           ": rope scaling '", c.rope_scaling.rope_type, "' is set on a '", type,
           "' model, whose rotary embedding (transformers' ",
           gemma ? "GemmaRotaryEmbedding" : "MistralRotaryEmbedding", ") has none");
  DS_CHECK(phi3 || c.partial_rotary_factor == 1.0, NotSupportedError, path,
           ": partial_rotary_factor is ", c.partial_rotary_factor, " on a '", type,
           "' model; finetune_llama reads it on 'phi3' models");
  // Only Phi-3's rotary embedding switches to the long factors (transformers 4.47's
  // LlamaRotaryEmbedding would keep the short ones at any length).
  DS_CHECK(phi3 || c.rope_scaling.rope_type != "longrope", NotSupportedError, path,
           ": rope scaling 'longrope' is set on a '", type, "' model; finetune_llama reads it on "
           "'phi3' models");
  if (c.rope_scaling.rope_type == "longrope") {
    auto& original = c.rope_scaling.original_max_position_embeddings;
    DS_CHECK(original == 0 || original == c.original_max_position_embeddings, ModelFileError,
             path, ": the rope scaling's original_max_position_embeddings (", original,
             ") and the config's (", c.original_max_position_embeddings, ") disagree");
    original = c.original_max_position_embeddings;
  }
  c.rms_norm_eps = j.value("rms_norm_eps", mixtral ? 1e-5 : c.rms_norm_eps);
  // LlamaConfig's default; GemmaConfig ties them.
  c.tie_word_embeddings = j.value("tie_word_embeddings", gemma);
  if (gemma) c.attention_bias = j.value("attention_bias", false);  // no mlp_bias
  if (type == "llama" || qwen3) {
    // LlamaConfig's and Qwen3Config's flags; Mistral has no biases and Qwen2 its fixed q/k/v
    // ones; Qwen3 has no mlp_bias.
    c.attention_bias = j.value("attention_bias", false);
    if (!qwen3) c.mlp_bias = j.value("mlp_bias", false);
  }
  // Mistral's, Phi-3's and Gemma's configs default their token ids; Llama's and Qwen's have none.
  const bool token_defaults = mistral || phi3 || gemma || deepseek;
  if (!token_defaults || j.contains("bos_token_id")) {
    c.bos_token_id = json_token_id(j, "bos_token_id");
  }
  if (!token_defaults || j.contains("eos_token_id")) {
    c.eos_token_id = json_token_id(j, "eos_token_id");
  }
  if (!(phi3 || gemma) || j.contains("pad_token_id")) {
    c.pad_token_id = json_token_id(j, "pad_token_id");
  }
  c.validate(path);
  return c;
}

bool LlamaConfig::is_sparse_layer(int64_t index) const {
  if (num_local_experts == 0) return false;
  if (deepseek()) return index >= first_k_dense_replace;
  if (!qwen_moe()) return true;  // Mixtral: every layer
  for (int64_t dense : mlp_only_layers) {
    if (dense == index) return false;
  }
  return (index + 1) % decoder_sparse_step == 0;
}

void LlamaConfig::validate(const std::string& source) const {
  DS_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 &&
               num_attention_heads > 0 && num_key_value_heads > 0 && head_dim > 0,
           ModelFileError, source, ": sizes must be positive (vocab ", vocab_size, ", hidden ",
           hidden_size, ", intermediate ", intermediate_size, ", layers ", num_hidden_layers,
           ", heads ", num_attention_heads, ", kv heads ", num_key_value_heads, ")");
  DS_CHECK(num_attention_heads % num_key_value_heads == 0, ModelFileError, source,
           ": attention heads (", num_attention_heads, ") are not a multiple of the key/value "
           "heads (", num_key_value_heads, ")");
  DS_CHECK(head_dim % 2 == 0, ModelFileError, source, ": head size ", head_dim,
           " is odd; rotary embeddings need an even one");
  DS_CHECK(partial_rotary_factor > 0 && partial_rotary_factor <= 1 && rotary_dim() % 2 == 0 &&
               rotary_dim() > 0,
           ModelFileError, source, ": partial_rotary_factor ", partial_rotary_factor,
           " rotates ", rotary_dim(), " of the head's ", head_dim,
           " features; expected an even number, at least 2");
  rope_scaling.validate(rotary_dim(), source);
}

nlohmann::json LlamaConfig::to_hf_json() const {
  nlohmann::json j = {
      {"architectures", {model_type == "mistral"     ? "MistralForCausalLM"
                         : model_type == "qwen2"     ? "Qwen2ForCausalLM"
                         : model_type == "mixtral"   ? "MixtralForCausalLM"
                         : model_type == "qwen3"     ? "Qwen3ForCausalLM"
                         : model_type == "qwen3_moe" ? "Qwen3MoeForCausalLM"
                         : model_type == "qwen2_moe" ? "Qwen2MoeForCausalLM"
                         : model_type == "phi3"      ? "Phi3ForCausalLM"
                         : model_type == "gemma"     ? "GemmaForCausalLM"
                         : model_type == "gemma2"    ? "Gemma2ForCausalLM"
                         : gemma3()                  ? "Gemma3ForCausalLM"
                                                     : "LlamaForCausalLM"}},
      {"model_type", model_type},
      {"vocab_size", vocab_size},
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"max_position_embeddings", max_position_embeddings},
      {"rope_theta", rope_theta},
      {"rope_scaling", rope_scaling.to_hf_json()},
      {"rms_norm_eps", rms_norm_eps},
      {"hidden_act", "silu"},
      {"attention_bias", attention_bias},
      {"attention_dropout", 0.0},
      {"mlp_bias", mlp_bias},
      {"tie_word_embeddings", tie_word_embeddings},
      {"torch_dtype", "float32"},
  };
  if (model_type == "mistral" || model_type == "mixtral") {
    // MistralConfig and MixtralConfig have no rope_scaling and no biases.
    for (const char* key : {"rope_scaling", "attention_bias", "mlp_bias"}) j.erase(key);
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json();
    if (model_type == "mixtral") {
      j["num_local_experts"] = num_local_experts;
      j["num_experts_per_tok"] = num_experts_per_tok;
      j["output_router_logits"] = output_router_logits;
      j["router_aux_loss_coef"] = router_aux_loss_coef;
      j["router_jitter_noise"] = 0.0;
    }
  } else if (model_type == "qwen2" || model_type == "qwen2_moe" || (qk_norm() && !gemma3())) {
    // Qwen2Config: no head_dim (hidden_size / heads), no bias flags (q/k/v have them).
    // Qwen3Config and Qwen3MoeConfig: head_dim and attention_bias, no mlp_bias.
    if (!qk_norm()) j.erase("head_dim");
    if (!qk_norm()) j.erase("attention_bias");
    j.erase("mlp_bias");
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
    j["max_window_layers"] = num_hidden_layers;
    if (qwen_moe()) {
      j["num_experts"] = num_local_experts;
      j["num_experts_per_tok"] = num_experts_per_tok;
      j["moe_intermediate_size"] = expert_intermediate_size();
      j["norm_topk_prob"] = norm_topk_prob;
      j["decoder_sparse_step"] = decoder_sparse_step;
      j["mlp_only_layers"] = mlp_only_layers;
      j["output_router_logits"] = output_router_logits;
      j["router_aux_loss_coef"] = router_aux_loss_coef;
    }
    if (model_type == "qwen2_moe") {
      j["shared_expert_intermediate_size"] = shared_expert_intermediate_size;
    }
  }
  if (model_type == "phi3") {
    // Phi3Config: the head size is hidden_size / heads; no bias flags.
    for (const char* key : {"head_dim", "attention_bias", "mlp_bias"}) j.erase(key);
    j["original_max_position_embeddings"] = original_max_position_embeddings;
    j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json();
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    if (partial_rotary_factor != 1.0) j["partial_rotary_factor"] = partial_rotary_factor;
    // Null where there is none: Phi3Config would default them (padding 32000, past a small
    // vocabulary).
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
    j["pad_token_id"] = nullptr;
  }
  if (gemma()) {
    // GemmaConfig: no rope_scaling, no mlp_bias; its activation under both names. Null token
    // ids where there are none (GemmaConfig would default them).
    j.erase("rope_scaling");
    j.erase("mlp_bias");
    j["hidden_act"] = "gelu_pytorch_tanh";
    j["hidden_activation"] = "gelu_pytorch_tanh";
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
    j["pad_token_id"] = nullptr;
    if (gemma2() || gemma3()) {
      const auto or_null = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(); };
      // An integer where it is one: transformers 5's Gemma2Config accepts nothing else.
      const auto whole = static_cast<int64_t>(query_pre_attn_scalar);
      j["query_pre_attn_scalar"] = static_cast<double>(whole) == query_pre_attn_scalar
                                       ? nlohmann::json(whole)
                                       : nlohmann::json(query_pre_attn_scalar);
      j["attn_logit_softcapping"] = or_null(attn_logit_softcapping);
      j["final_logit_softcapping"] = or_null(final_logit_softcapping);
      j["sliding_window"] = sliding_window > 0 ? nlohmann::json(sliding_window) : nlohmann::json();
    }
    if (gemma3()) {
      // Gemma3TextConfig's older keys, which transformers 5 still reads: the global layers'
      // scaling, the sliding layers' base and which layers slide.
      j["rope_scaling"] = rope_scaling.to_hf_json();
      j["rope_local_base_freq"] = rope_local_theta;
      nlohmann::json types = nlohmann::json::array();
      for (int64_t i = 0; i < num_hidden_layers; ++i) {
        types.push_back(is_sliding_layer(i) ? "sliding_attention" : "full_attention");
      }
      j["layer_types"] = types;
    }
  }
  if (deepseek()) {
    write_deepseek(*this, &j);
    // Null where there is none: DeepseekV3Config would default them.
    j["bos_token_id"] = nullptr;
    j["eos_token_id"] = nullptr;
  }
  if (bos_token_id >= 0) j["bos_token_id"] = bos_token_id;
  if (eos_token_id >= 0) j["eos_token_id"] = eos_token_id;
  if (pad_token_id >= 0) j["pad_token_id"] = pad_token_id;
  return j;
}

}  // namespace deepspeed::examples

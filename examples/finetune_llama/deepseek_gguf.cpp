// DeepSeek's GGUF metadata (see deepseek_gguf.h). The converter stores the latent attention as
// llama.cpp runs it, one key/value head of kv_lora_rank + qk_rope_head_dim features
// (attention.key_length) expanded per head afterwards (attention.key_length_mla and
// value_length_mla); files written before it did so hold the expanded sizes as key_length and
// value_length and one key/value head per head.
#include "deepseek_gguf.h"

#include "gguf_file.h"
#include "util/check.h"

namespace deepspeed::examples {
namespace {

int64_t int_or(const GgufFile& f, const std::string& key, int64_t fallback) {
  return f.has(key) ? f.get_int(key) : fallback;
}

// llama.cpp's yarn for DeepSeek: the factor, the original context and yarn_log_multiplier,
// 0.1 mscale_all_dim, which scales the softmax by mscale(factor, mscale_all_dim)^2 and leaves
// the rotation's magnitude alone: transformers' yarn with mscale equal to mscale_all_dim, as
// DeepSeek's configs set them.
RopeScaling read_rope_scaling(const GgufFile& f, const std::string& p) {
  RopeScaling s;
  const std::string type =
      f.has(p + "rope.scaling.type") ? f.get_string(p + "rope.scaling.type") : "none";
  if (type == "none") return s;
  DS_CHECK(type == "yarn", NotSupportedError, "GGUF file ", f.path(), ": metadata '", p,
           "rope.scaling.type' is '", type, "'; a DeepSeek model reads 'yarn' or 'none'");
  s.rope_type = "yarn";
  s.factor = f.get_float(p + "rope.scaling.factor");
  s.original_max_position_embeddings = f.get_int(p + "rope.scaling.original_context_length");
  if (f.has(p + "rope.scaling.yarn_beta_fast")) {
    s.beta_fast = f.get_float(p + "rope.scaling.yarn_beta_fast");
  }
  if (f.has(p + "rope.scaling.yarn_beta_slow")) {
    s.beta_slow = f.get_float(p + "rope.scaling.yarn_beta_slow");
  }
  if (f.has(p + "rope.scaling.yarn_log_multiplier")) {
    const double all_dim = f.get_float(p + "rope.scaling.yarn_log_multiplier") / 0.1;
    s.mscale = all_dim;
    s.mscale_all_dim = all_dim;
  }
  return s;
}

}  // namespace

void read_deepseek_gguf(const GgufFile& f, const std::string& p, LlamaConfig* c) {
  const std::string source = "GGUF file " + f.path();
  // V3's router scores by sigmoid (llama.cpp's expert_gating_func 2), V2's by softmax (1, the
  // default of the files written before the key).
  const bool v3 = int_or(f, p + "expert_gating_func", 1) == 2;
  c->model_type = v3 ? "deepseek_v3" : "deepseek_v2";
  // Latent attention expands one key and value per head.
  c->num_key_value_heads = c->num_attention_heads;
  c->head_dim = f.get_int(p + "rope.dimension_count");
  c->rope_interleave = true;  // llama.cpp rotates adjacent pairs, as DeepSeek's weights expect
  c->kv_lora_rank = f.get_int(p + "attention.kv_lora_rank");
  c->q_lora_rank = int_or(f, p + "attention.q_lora_rank", 0);
  const bool mla = f.has(p + "attention.key_length_mla");
  const int64_t qk_head = mla ? f.get_int(p + "attention.key_length_mla")
                              : f.get_int(p + "attention.key_length");
  c->v_head_dim = mla ? f.get_int(p + "attention.value_length_mla")
                      : f.get_int(p + "attention.value_length");
  c->qk_nope_head_dim = qk_head - c->head_dim;
  DS_CHECK(c->head_dim > 0 && c->qk_nope_head_dim >= 0 && c->kv_lora_rank > 0 &&
               c->v_head_dim > 0 && c->q_lora_rank >= 0,
           ModelFileError, source, ": metadata '", p, "rope.dimension_count' (", c->head_dim,
           "), the query/key head size (", qk_head, "), '", p, "attention.kv_lora_rank' (",
           c->kv_lora_rank, ") and the value head size (", c->v_head_dim,
           ") do not make a latent attention");
  c->rope_scaling = read_rope_scaling(f, p);
  c->attention_bias = f.find_tensor("blk.0.attn_kv_a_mqa.bias") != nullptr;

  c->first_k_dense_replace = int_or(f, p + "leading_dense_block_count", 0);
  c->num_local_experts = int_or(f, p + "expert_count", 0);
  c->topk_method = v3 ? "noaux_tc" : "greedy";
  c->norm_topk_prob = f.has(p + "expert_weights_norm") &&
                      f.metadata().at(p + "expert_weights_norm") == true;
  DS_CHECK(v3 || !c->norm_topk_prob, NotSupportedError, source, ": metadata '", p,
           "expert_weights_norm' is true on a softmax router; transformers' DeepseekV2 never "
           "renormalises its k weights");
  if (c->num_local_experts == 0) return;
  c->moe_intermediate_size = f.get_int(p + "expert_feed_forward_length");
  c->n_shared_experts = int_or(f, p + "expert_shared_count", 0);
  c->shared_expert_intermediate_size = c->moe_intermediate_size * c->n_shared_experts;
  c->routed_scaling_factor =
      f.has(p + "expert_weights_scale") ? f.get_float(p + "expert_weights_scale") : 1.0;
  c->num_experts_per_tok = f.get_int(p + "expert_used_count");
  DS_CHECK(c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_local_experts,
           ModelFileError, source, ": metadata '", p, "expert_used_count' (",
           c->num_experts_per_tok, ") must be in 1..", p, "expert_count (", c->num_local_experts,
           ")");
  // Group-limited routing: V3's always (one group when the file has none); V2's where the
  // topk_group best of n_group groups are fewer than all.
  const int64_t groups = int_or(f, p + "expert_group_count", 1);
  const int64_t used = int_or(f, p + "expert_group_used_count", groups);
  if (!v3 && used >= groups) return;
  if (!v3) c->topk_method = "group_limited_greedy";
  c->n_group = groups;
  c->topk_group = used;
  DS_CHECK(groups > 0 && c->num_local_experts % groups == 0 && used > 0 && used <= groups &&
               c->num_experts_per_tok <= used * (c->num_local_experts / groups) &&
               (!v3 || c->num_local_experts / groups >= 2),
           ModelFileError, source, ": metadata '", p, "expert_group_count' (", groups, ") and '",
           p, "expert_group_used_count' (", used, ") do not fit ", c->num_local_experts,
           " experts with ", c->num_experts_per_tok, " per token");
}

}  // namespace deepspeed::examples

// DeepSeek's config.json keys (see deepseek_config.h). Defaults are transformers 5.15's
// DeepseekV2Config and DeepseekV3Config ones.
#include "deepseek_config.h"

#include "config_json.h"
#include "gguf_file.h"  // ModelFileError
#include "util/check.h"

namespace deepspeed::examples {
namespace {

double number_or(const nlohmann::json& j, const char* key, const std::string& path,
                 double fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  DS_CHECK(j[key].is_number(), ModelFileError, path, ": '", key, "' is ", j[key].type_name(),
           "; expected a number");
  return j[key].get<double>();
}

std::string string_or(const nlohmann::json& j, const char* key, const std::string& path,
                      const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  DS_CHECK(j[key].is_string(), ModelFileError, path, ": '", key, "' is ", j[key].type_name(),
           "; expected a string");
  return j[key].get<std::string>();
}

// The routed experts: how many, their width, k, the dense layers before the first sparse one,
// the shared experts and the router (V2: softmax, optionally group-limited; V3: sigmoid over
// groups scored by their two best, with a bias). The original DeepSeek files' keys transformers
// ignores are checked against the one value it assumes.
void read_experts(const nlohmann::json& j, const std::string& path, bool v3, LlamaConfig* c) {
  c->num_local_experts = int_or(j, "n_routed_experts", path, v3 ? 256 : 64);
  c->moe_intermediate_size = int_or(j, "moe_intermediate_size", path, v3 ? 2048 : 1407);
  c->n_shared_experts = int_or(j, "n_shared_experts", path, v3 ? 1 : 2);
  c->first_k_dense_replace = int_or(j, "first_k_dense_replace", path, v3 ? 3 : 0);
  c->routed_scaling_factor = number_or(j, "routed_scaling_factor", path, v3 ? 2.5 : 1.0);
  DS_CHECK(c->num_local_experts >= 0 && c->moe_intermediate_size > 0 &&
               c->n_shared_experts >= 0 && c->first_k_dense_replace >= 0,
           ModelFileError, path, ": n_routed_experts (", c->num_local_experts,
           "), n_shared_experts (", c->n_shared_experts, ") and first_k_dense_replace (",
           c->first_k_dense_replace, ") must not be negative, moe_intermediate_size (",
           c->moe_intermediate_size, ") must be positive");
  c->shared_expert_intermediate_size = c->moe_intermediate_size * c->n_shared_experts;
  DS_CHECK(int_or(j, "moe_layer_freq", path, 1) == 1, NotSupportedError, path,
           ": moe_layer_freq is ", j.value("moe_layer_freq", nlohmann::json()).dump(),
           "; finetune_llama, as transformers, makes every layer from first_k_dense_replace on "
           "sparse (moe_layer_freq 1)");
  const std::string scoring = string_or(j, "scoring_func", path, v3 ? "sigmoid" : "softmax");
  DS_CHECK(scoring == (v3 ? "sigmoid" : "softmax"), NotSupportedError, path,
           ": scoring_func is '", scoring, "'; a '", c->model_type, "' router scores with ",
           v3 ? "sigmoid" : "softmax");
  c->topk_method = string_or(j, "topk_method", path, v3 ? "noaux_tc" : "greedy");
  DS_CHECK(v3 ? c->topk_method == "noaux_tc"
              : c->topk_method == "greedy" || c->topk_method == "group_limited_greedy",
           NotSupportedError, path, ": topk_method is '", c->topk_method, "'; finetune_llama's '",
           c->model_type, "' reads ", v3 ? "'noaux_tc'" : "'greedy' and 'group_limited_greedy'");
  c->norm_topk_prob = j.value("norm_topk_prob", v3);
  DS_CHECK(v3 || !c->norm_topk_prob, NotSupportedError, path, ": norm_topk_prob is true; "
           "transformers' DeepseekV2 router never renormalises its k weights");
  if (c->num_local_experts == 0) return;
  DS_CHECK(v3 || j.contains("num_experts_per_tok"), ModelFileError, path,
           ": 'num_experts_per_tok' is missing");
  c->num_experts_per_tok = int_or(j, "num_experts_per_tok", path, 8);
  DS_CHECK(c->num_experts_per_tok > 0 && c->num_experts_per_tok <= c->num_local_experts,
           ModelFileError, path, ": num_experts_per_tok (", c->num_experts_per_tok,
           ") must be in 1..n_routed_experts (", c->num_local_experts, ")");
  const bool grouped = v3 || c->topk_method == "group_limited_greedy";
  if (!grouped) return;
  // V3's defaults when absent; null where grouping is required is an error, not a default.
  c->n_group = j.contains("n_group") ? json_int(j, "n_group", path) : v3 ? 8 : 0;
  c->topk_group = j.contains("topk_group") ? json_int(j, "topk_group", path) : v3 ? 4 : 0;
  DS_CHECK(c->n_group > 0 && c->num_local_experts % c->n_group == 0, ModelFileError, path,
           ": n_group is ", c->n_group, "; expected a positive divisor of n_routed_experts (",
           c->num_local_experts, ")");
  const int64_t per_group = c->num_local_experts / c->n_group;
  DS_CHECK(c->topk_group > 0 && c->topk_group <= c->n_group, ModelFileError, path,
           ": topk_group is ", c->topk_group, "; expected 1..n_group (", c->n_group, ")");
  DS_CHECK(!v3 || per_group >= 2, ModelFileError, path, ": n_group ", c->n_group, " leaves ",
           per_group, " expert per group; DeepSeek-V3 scores a group by its two best");
  DS_CHECK(c->num_experts_per_tok <= c->topk_group * per_group, ModelFileError, path,
           ": num_experts_per_tok (", c->num_experts_per_tok, ") exceeds the ",
           c->topk_group * per_group, " experts of the topk_group best groups");
}

}  // namespace

void read_deepseek(const nlohmann::json& j, const std::string& path, LlamaConfig* c) {
  const bool v3 = c->model_type == "deepseek_v3";
  DS_CHECK(string_or(j, "hidden_act", path, "silu") == "silu", NotSupportedError, path,
           ": hidden_act is ", j["hidden_act"].dump(), "; finetune_llama's MLP is SwiGLU (silu)");
  DS_CHECK(number_or(j, "attention_dropout", path, 0.0) == 0.0, NotSupportedError, path,
           ": attention_dropout is ", j["attention_dropout"].dump(),
           "; finetune_llama trains without dropout");
  DS_CHECK(c->num_key_value_heads == c->num_attention_heads, NotSupportedError, path,
           ": num_key_value_heads (", c->num_key_value_heads, ") differs from "
           "num_attention_heads (", c->num_attention_heads, "); latent attention expands one "
           "key and value per head");
  c->q_lora_rank = int_or(j, "q_lora_rank", path, j.contains("q_lora_rank") ? 0 : 1536);
  c->kv_lora_rank = int_or(j, "kv_lora_rank", path, 512);
  c->qk_nope_head_dim = int_or(j, "qk_nope_head_dim", path, 128);
  c->v_head_dim = int_or(j, "v_head_dim", path, 128);
  const int64_t rope = int_or(j, "qk_rope_head_dim", path, 64);
  // The configs set head_dim to qk_rope_head_dim, what their rotary embedding spans.
  DS_CHECK(int_or(j, "head_dim", path, rope) == rope, ModelFileError, path, ": head_dim (",
           j.value("head_dim", nlohmann::json()).dump(), ") differs from qk_rope_head_dim (",
           rope, ")");
  c->head_dim = rope;
  DS_CHECK(c->q_lora_rank >= 0 && c->kv_lora_rank > 0 && c->qk_nope_head_dim >= 0 &&
               c->v_head_dim > 0,
           ModelFileError, path, ": q_lora_rank (", c->q_lora_rank, "), kv_lora_rank (",
           c->kv_lora_rank, "), qk_nope_head_dim (", c->qk_nope_head_dim, ") and v_head_dim (",
           c->v_head_dim, ") must be positive (q_lora_rank null: none)");
  c->rope_interleave = !v3 || j.value("rope_interleave", true);
  c->attention_bias = j.value("attention_bias", false);
  if (!v3) c->mlp_bias = j.value("mlp_bias", false);  // DeepseekV2MLP is LlamaMLP
  read_experts(j, path, v3, c);
}

void write_deepseek(const LlamaConfig& c, nlohmann::json* j) {
  const bool v3 = c.model_type == "deepseek_v3";
  const auto or_null = [](int64_t v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(); };
  (*j)["architectures"] = {v3 ? "DeepseekV3ForCausalLM" : "DeepseekV2ForCausalLM"};
  if (v3) j->erase("mlp_bias");
  (*j)["q_lora_rank"] = or_null(c.q_lora_rank);
  (*j)["kv_lora_rank"] = c.kv_lora_rank;
  (*j)["qk_nope_head_dim"] = c.qk_nope_head_dim;
  (*j)["qk_rope_head_dim"] = c.head_dim;
  (*j)["v_head_dim"] = c.v_head_dim;
  if (v3) (*j)["rope_interleave"] = c.rope_interleave;
  (*j)["n_routed_experts"] = or_null(c.num_local_experts);
  (*j)["n_shared_experts"] = c.n_shared_experts;
  (*j)["moe_intermediate_size"] = c.expert_intermediate_size();
  (*j)["num_experts_per_tok"] = c.num_experts_per_tok;
  (*j)["first_k_dense_replace"] = c.first_k_dense_replace;
  (*j)["routed_scaling_factor"] = c.routed_scaling_factor;
  (*j)["norm_topk_prob"] = c.norm_topk_prob;
  (*j)["topk_method"] = c.topk_method;
  (*j)["n_group"] = or_null(c.n_group);
  (*j)["topk_group"] = or_null(c.topk_group);
}

}  // namespace deepspeed::examples

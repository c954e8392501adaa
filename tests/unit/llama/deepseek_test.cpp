// DeepSeek-V2 and V3 in finetune_llama: their config.json keys (DeepseekV2Config's and
// DeepseekV3Config's defaults, the round trip, each refusal by name), multi-head latent
// attention's KV cache of latents (step-by-step logits equal the full forward's; the cache
// holds latents, not heads), DeepSeek's sparse blocks (shared experts, V3's router bias) saved
// under transformers' names and read back bit-identically, and LoRA on the latent projections.
// Their arithmetic against transformers is llama_parity_test's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "gguf_file.h"  // ModelFileError
#include "llama_weights.h"
#include "mla_attention.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::TempDir;

// A DeepSeek-V3 config.json as transformers 5 writes one, small: 2 layers, the second sparse.
nlohmann::json v3_json() {
  return {{"model_type", "deepseek_v3"}, {"vocab_size", 120}, {"hidden_size", 32},
          {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 4}, {"head_dim", 4}, {"q_lora_rank", 12},
          {"kv_lora_rank", 8}, {"qk_nope_head_dim", 6}, {"qk_rope_head_dim", 4},
          {"v_head_dim", 5}, {"n_routed_experts", 8}, {"n_shared_experts", 2},
          {"moe_intermediate_size", 6}, {"num_experts_per_tok", 2}, {"n_group", 4},
          {"topk_group", 2}, {"first_k_dense_replace", 1}, {"routed_scaling_factor", 2.5},
          {"max_position_embeddings", 64}, {"tie_word_embeddings", false}};
}

LlamaConfig v3_config() { return LlamaConfig::from_hf_json(v3_json(), "v3/config.json"); }

TEST(DeepseekConfig, V3KeysDefaultsAndRoundTrip) {
  const auto c = v3_config();
  EXPECT_TRUE(c.deepseek() && c.experts_named_as_mlp());
  EXPECT_EQ(c.head_dim, 4);
  EXPECT_EQ(c.qk_head_dim(), 10);
  EXPECT_EQ(c.shared_expert_intermediate_size, 12);  // 2 shared experts of 6
  EXPECT_TRUE(c.norm_topk_prob && c.rope_interleave);
  EXPECT_EQ(c.topk_method, "noaux_tc");
  EXPECT_EQ(c.bos_token_id, 0);  // DeepseekV3Config's
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_FALSE(c.is_sparse_layer(0));
  EXPECT_TRUE(c.is_sparse_layer(1));
  const auto back = c.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(back["qk_rope_head_dim"], 4);
  EXPECT_FALSE(back.contains("mlp_bias"));
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);

  auto j = v3_json();
  for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                          "v_head_dim", "n_routed_experts", "n_shared_experts", "n_group",
                          "topk_group", "first_k_dense_replace", "routed_scaling_factor",
                          "moe_intermediate_size", "num_experts_per_tok", "head_dim",
                          "max_position_embeddings"}) {
    j.erase(key);
  }
  const auto d = LlamaConfig::from_hf_json(j, "v3/config.json");  // DeepseekV3Config's defaults
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.num_local_experts, 256);
  EXPECT_EQ(d.num_experts_per_tok, 8);
  EXPECT_EQ(d.n_group, 8);
  EXPECT_EQ(d.topk_group, 4);
  EXPECT_EQ(d.first_k_dense_replace, 3);
  EXPECT_EQ(d.routed_scaling_factor, 2.5);
  EXPECT_EQ(d.max_position_embeddings, 4096);
  j = v3_json();
  j["q_lora_rank"] = nullptr;  // DeepSeek-V2-Lite's form: one q_proj
  EXPECT_EQ(LlamaConfig::from_hf_json(j, "v3/config.json").q_lora_rank, 0);
}

TEST(DeepseekConfig, V2KeysDefaultsAndRoundTrip) {
  auto j = v3_json();
  j["model_type"] = "deepseek_v2";
  j["topk_method"] = "group_limited_greedy";
  const auto c = LlamaConfig::from_hf_json(j, "v2/config.json");
  EXPECT_FALSE(c.norm_topk_prob);
  EXPECT_EQ(c.topk_method, "group_limited_greedy");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  const auto back = c.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "DeepseekV2ForCausalLM");
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  j.erase("topk_method");
  for (const char* key : {"n_group", "topk_group", "n_routed_experts", "n_shared_experts"}) {
    j.erase(key);
  }
  const auto d = LlamaConfig::from_hf_json(j, "v2/config.json");  // DeepseekV2Config's
  EXPECT_EQ(d.topk_method, "greedy");
  EXPECT_EQ(d.n_group, 0);
  EXPECT_EQ(d.num_local_experts, 64);
  EXPECT_EQ(d.shared_expert_intermediate_size, 12);  // 2 shared experts of 6
  EXPECT_EQ(d.routed_scaling_factor, 2.5);
  j.erase("num_experts_per_tok");  // DeepseekV2Config has no default
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(j, "v2/config.json"), ModelFileError,
                    "v2/config.json: 'num_experts_per_tok' is missing");
}

TEST(DeepseekConfig, RefusesWhatItDoesNotRunByName) {
  const auto refused = [](const char* key, const nlohmann::json& value,
                          const std::string& type = "deepseek_v3") {
    auto j = v3_json();
    j["model_type"] = type;
    j[key] = value;
    return j;
  };
  const std::string p = "d/config.json";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("moe_layer_freq", 2), p), NotSupportedError,
                    "d/config.json: moe_layer_freq is 2");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("scoring_func", "softmax"), p),
                    NotSupportedError, "scoring_func is 'softmax'; a 'deepseek_v3' router");
  EXPECT_THROW_WITH(
      LlamaConfig::from_hf_json(refused("scoring_func", "sigmoid", "deepseek_v2"), p),
      NotSupportedError, "scoring_func is 'sigmoid'; a 'deepseek_v2' router scores with softmax");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("topk_method", "greedy"), p),
                    NotSupportedError, "topk_method is 'greedy'");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("norm_topk_prob", true, "deepseek_v2"), p),
                    NotSupportedError, "norm_topk_prob is true");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("num_key_value_heads", 2), p),
                    NotSupportedError, "num_key_value_heads (2) differs");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("head_dim", 8), p), ModelFileError,
                    "head_dim (8) differs from qk_rope_head_dim (4)");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("hidden_act", "gelu"), p),
                    NotSupportedError, "hidden_act is \"gelu\"");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("attention_dropout", 0.1), p),
                    NotSupportedError, "attention_dropout is 0.1");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("n_group", 3), p), ModelFileError,
                    "n_group is 3; expected a positive divisor of n_routed_experts (8)");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("n_group", 8), p), ModelFileError,
                    "leaves 1 expert per group");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("n_group", nullptr), p), ModelFileError,
                    "'n_group' is null; expected an integer");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("topk_group", 5), p), ModelFileError,
                    "topk_group is 5; expected 1..n_group (4)");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("num_experts_per_tok", 5), p),
                    ModelFileError, "num_experts_per_tok (5) exceeds the 4 experts");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(refused("kv_lora_rank", 0), p), ModelFileError,
                    "kv_lora_rank (0)");
}

// The cache holds each layer's latents and rotated shared keys; stepping through it gives the
// full forward's logits, with and without the query bottleneck and the interleaved pairs.
TEST(MultiLatentAttention, KvCacheOfLatentsGivesTheLogitsOfTheFullSequence) {
  for (const bool bottleneck : {true, false}) {
    auto c = v3_config();
    if (!bottleneck) {
      c.q_lora_rank = 0;
      c.rope_interleave = false;
    }
    torch::manual_seed(5);
    LlamaForCausalLM model(c);
    const auto& attn = model->model->units[0]->latent_attn;
    ASSERT_TRUE(attn);
    EXPECT_EQ(static_cast<bool>(attn->q_proj), !bottleneck);
    EXPECT_EQ(static_cast<bool>(attn->q_a_layernorm), bottleneck);
    torch::NoGradGuard no_grad;
    const auto ids = torch::randint(0, c.vocab_size, {2, 9}, torch::kLong);
    const auto full = model->logits(ids);
    LlamaKvCache cache;
    std::vector<torch::Tensor> steps = {model->logits(ids.slice(1, 0, 5), &cache)};
    EXPECT_EQ(cache.length(), 5);
    EXPECT_EQ(cache.keys[0].sizes(), (std::vector<int64_t>{2, 1, 5, c.kv_lora_rank}));
    EXPECT_EQ(cache.values[0].sizes(), (std::vector<int64_t>{2, 1, 5, c.head_dim}));
    for (int64_t t = 5; t < 9; ++t) steps.push_back(model->logits(ids.slice(1, t, t + 1), &cache));
    EXPECT_TRUE(torch::allclose(torch::cat(steps, 1), full, 1e-5, 1e-5)) << bottleneck;
  }
}

// Shared experts, the router's score correction bias (a buffer) and the latent projections go
// to transformers' names and come back bit-identically; the bias weighs in the logits.
TEST(DeepseekWeights, FolderRoundTripKeepsSharedExpertsAndTheRouterBias) {
  const auto c = v3_config();
  torch::manual_seed(6);
  LlamaForCausalLM ref(c);
  auto& sparse = *ref->model->units[1];
  ASSERT_TRUE(sparse.sparse_moe && sparse.shared_expert && !sparse.shared_expert_gate);
  ASSERT_TRUE(sparse.sparse_moe->score_correction_bias.defined());
  EXPECT_EQ(sparse.sparse_moe->options().score_func, "sigmoid");
  EXPECT_EQ(sparse.sparse_moe->options().num_expert_groups, 4);
  EXPECT_EQ(sparse.sparse_moe->options().route_scale, 2.5);
  {
    torch::NoGradGuard no_grad;
    sparse.sparse_moe->score_correction_bias.uniform_(-1.0, 1.0);
  }
  TempDir dir;
  save_hf_weights(*ref, dir.file("hf"), true);
  const auto saved = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  for (const char* name : {"model.layers.1.mlp.gate.e_score_correction_bias",
                           "model.layers.1.mlp.shared_experts.down_proj.weight",
                           "model.layers.1.mlp.experts.7.up_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.0.self_attn.q_a_layernorm.weight",
                           "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
                           "model.layers.0.self_attn.kv_b_proj.weight"}) {
    EXPECT_NE(saved.find(name), nullptr) << name;
  }
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  LlamaForCausalLM loaded(ck.config, ck.weights);
  EXPECT_TRUE(torch::equal(loaded->model->units[1]->sparse_moe->score_correction_bias,
                           sparse.sparse_moe->score_correction_bias));
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(c.vocab_size, {1, 12});
  const auto logits = ref->logits(ids);
  EXPECT_TRUE(torch::equal(logits, loaded->logits(ids)));
  loaded->model->units[1]->sparse_moe->score_correction_bias.zero_();
  EXPECT_FALSE(torch::allclose(logits, loaded->logits(ids)));
}

// LoRA adapters on the latent projections DeepSpeed's target_mods name.
TEST(MultiLatentAttention, LoraTargetsTheLatentProjections) {
  auto c = v3_config();
  c.lora = linear::LoRAConfig{};
  c.lora->lora_r = 2;
  c.lora->target_mods = {"kv_b_proj", "q_a_proj"};
  torch::manual_seed(7);
  LlamaForCausalLM model(c);
  const auto& attn = model->model->units[0]->latent_attn;
  EXPECT_TRUE(attn->kv_b_proj->lora_enabled());
  EXPECT_TRUE(attn->q_a_proj->lora_enabled());
  EXPECT_FALSE(attn->kv_a_proj_with_mqa->lora_enabled());
  EXPECT_FALSE(attn->o_proj->lora_enabled());
  const auto ids = torch::randint(c.vocab_size, {1, 6});
  model->forward(ids, ids).backward();
  EXPECT_TRUE(attn->kv_b_proj->lora_weight_1->weight.grad().defined());
}

}  // namespace
}  // namespace deepspeed::examples

// Loading a Llama from GGUF and Hugging Face folders: hyper-parameters from metadata, names and
// the q/k row order undone, the HF folder written by save_hf_weights read back bit-identically,
// and the bad inputs (missing config.json, vocabulary/embedding mismatch). Mistral's, Mixtral's,
// Qwen2's, Qwen3's and Qwen3-MoE's configs (and transformers 5's rope_parameters), Qwen2's biases
// (also under LoRA) from a "qwen2" GGUF and a folder, Qwen3-MoE's folder names, Qwen3-MoE and
// Mixtral GGUFs, Phi-3's config, longrope and fused projections, from a folder and a GGUF.
#include "llama_weights.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "generation.h"
#include "gguf_file.h"
#include "gguf_test_writer.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::GgufTestWriter;
using testing::TempDir;

LlamaConfig tiny_config() {
  LlamaConfig c;
  c.vocab_size = 300;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  c.rope_theta = 10000.0;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  return c;
}

// llama.cpp's converter order for q/k rows, written from its description: within each head the
// first and second halves are interleaved.
torch::Tensor permute_like_converter(const torch::Tensor& w, int64_t n_head) {
  const int64_t rows = w.size(0);
  return w.reshape({n_head, 2, rows / n_head / 2, w.size(1)}).transpose(1, 2).reshape(w.sizes());
}

std::vector<uint8_t> f32_bytes(const torch::Tensor& t) {
  auto c = t.contiguous();
  std::vector<uint8_t> b(static_cast<size_t>(c.numel()) * 4);
  std::memcpy(b.data(), c.data_ptr<float>(), b.size());
  return b;
}

// A GGUF file of `model`'s weights (F32), as llama.cpp's converter lays them out. `more_metadata`
// adds keys; `write_experts` writes a stacked expert parameter (Mixtral's "...experts.w1") its
// own way.
using ExpertWriter = std::function<void(GgufTestWriter&, const std::string&, const torch::Tensor&)>;
void write_gguf(LlamaForCausalLMImpl& model, const LlamaConfig& c, const std::string& path,
                int64_t vocab_in_metadata,
                const std::function<void(GgufTestWriter&)>& more_metadata = {},
                const ExpertWriter& write_experts = {}) {
  GgufTestWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.kv_u32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.kv_u32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.kv_u32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.kv_u32("llama.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.kv_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.kv_f32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.kv_u32("llama.vocab_size", static_cast<uint32_t>(vocab_in_metadata));
  if (more_metadata) more_metadata(w);
  for (const auto& item : model.named_parameters()) {
    torch::Tensor t = item.value().detach();
    const std::string& name = item.key();
    if (write_experts && t.dim() == 3) {
      write_experts(w, name, t);
      continue;
    }
    if (name.find("q_proj") != std::string::npos) t = permute_like_converter(t, c.num_attention_heads);
    if (name.find("k_proj") != std::string::npos) t = permute_like_converter(t, c.num_key_value_heads);
    std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
    w.tensor(gguf_tensor_name(name), ne, 0, f32_bytes(t));
  }
  w.write(path);
}

TEST(LlamaWeights, GgufLoadsConfigAndWeightsWithRopeRowsRestored) {
  TempDir dir;
  torch::manual_seed(0);
  const auto c = tiny_config();
  LlamaForCausalLM ref(c);
  write_gguf(*ref, c, dir.file("tiny.gguf"), c.vocab_size);
  const auto ck = open_llama_checkpoint(dir.file("tiny.gguf"));
  EXPECT_TRUE(ck.is_gguf);
  EXPECT_EQ(ck.config.num_hidden_layers, 2);
  EXPECT_EQ(ck.config.num_key_value_heads, 2);
  EXPECT_EQ(ck.config.head_dim, 4);
  EXPECT_EQ(ck.config.vocab_size, 300);
  EXPECT_EQ(ck.config.max_position_embeddings, 64);
  EXPECT_TRUE(ck.config.tie_word_embeddings);  // no output.weight
  EXPECT_FLOAT_EQ(static_cast<float>(ck.config.rms_norm_eps), 1e-5f);
  LlamaForCausalLM loaded(ck.config, ck.weights);
  auto a = ref->named_parameters(), b = loaded->named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (const auto& item : a) EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key();
  auto ids = torch::randint(0, 300, {1, 7}, torch::kLong);
  EXPECT_TRUE(torch::equal(ref->logits(ids), loaded->logits(ids)));
}

TEST(LlamaWeights, UnpermuteInvertsTheConverterForEveryHeadCount) {
  for (int64_t heads : {1, 2, 3, 9}) {
    auto w = torch::randn({heads * 8, 5});
    EXPECT_TRUE(torch::equal(unpermute_rope_rows(permute_like_converter(w, heads), heads), w));
  }
}

TEST(LlamaWeights, GgufVocabularyMismatchNamesFileAndField) {
  TempDir dir;
  const auto c = tiny_config();
  LlamaForCausalLM ref(c);
  write_gguf(*ref, c, dir.file("bad.gguf"), 301);
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("bad.gguf")), ModelFileError,
                    "llama.vocab_size' or the tokenizer.ggml.tokens count) != the rows of tensor "
                    "'token_embd.weight' (300)");
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("bad.gguf")), ModelFileError, dir.file("bad.gguf"));
}

TEST(LlamaWeights, HfFolderRoundTripIsBitIdentical) {
  TempDir dir;
  auto c = tiny_config();
  c.tie_word_embeddings = false;
  LlamaForCausalLM ref(c);
  save_hf_weights(*ref, dir.file("hf"), /*write=*/true);
  EXPECT_TRUE(std::filesystem::exists(dir.file("hf/generation_config.json")));
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  EXPECT_FALSE(ck.is_gguf);
  EXPECT_FALSE(ck.config.tie_word_embeddings);
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  // A config.json without the key means untied, as transformers' LlamaConfig defaults.
  auto j = c.to_hf_json();
  j.erase("tie_word_embeddings");
  EXPECT_FALSE(LlamaConfig::from_hf_json(j, "config.json").tie_word_embeddings);
}

// Sharded: model.safetensors.index.json's weight_map spreads the tensors over two files.
TEST(LlamaWeights, ShardedHfFolderLoads) {
  TempDir dir;
  auto c = tiny_config();
  LlamaForCausalLM ref(c);
  save_hf_weights(*ref, dir.file("hf"), true);
  const auto all = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  std::filesystem::remove(dir.file("hf/model.safetensors"));
  checkpoint::TensorDict shard[2];
  nlohmann::json map = nlohmann::json::object();
  size_t i = 0;
  for (const auto& item : all) {
    const int s = static_cast<int>(i++ % 2);
    shard[s].insert(item.key(), item.value());
    map[item.key()] = "model-0000" + std::to_string(s + 1) + "-of-00002.safetensors";
  }
  checkpoint::save_safetensors(shard[0], dir.file("hf/model-00001-of-00002.safetensors"));
  checkpoint::save_safetensors(shard[1], dir.file("hf/model-00002-of-00002.safetensors"));
  std::ofstream(dir.file("hf/model.safetensors.index.json")) << nlohmann::json{{"weight_map", map}}.dump();
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  map.erase("model.norm.weight");
  std::ofstream(dir.file("hf/model.safetensors.index.json")) << nlohmann::json{{"weight_map", map}}.dump();
  const auto missing = open_llama_checkpoint(dir.file("hf"));
  EXPECT_THROW_WITH(LlamaForCausalLM(missing.config, missing.weights), ModelFileError,
                    "tensor 'model.norm.weight' is in no *.safetensors file");
}

TEST(LlamaWeights, HfFolderErrorsNameFileAndField) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("empty"));
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("empty")), ModelFileError, "config.json");
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("empty")), ModelFileError, "is missing");

  auto c = tiny_config();
  LlamaForCausalLM ref(c);
  save_hf_weights(*ref, dir.file("hf"), true);
  auto j = c.to_hf_json();
  j["vocab_size"] = 512;
  std::ofstream(dir.file("hf/config.json")) << j.dump();
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("hf")), ModelFileError,
                    "config.json: vocab_size is 512 but model.embed_tokens.weight has shape [300, 16]");
  j.erase("num_attention_heads");
  std::ofstream(dir.file("hf/config.json")) << j.dump();
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("hf")), ModelFileError,
                    "'num_attention_heads' is missing");
}

TEST(LlamaModel, KvCacheGivesTheLogitsOfTheFullSequence) {
  torch::manual_seed(1);
  LlamaForCausalLM model(tiny_config());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 300, {1, 9}, torch::kLong);
  auto full = model->logits(ids);
  LlamaKvCache cache;
  auto first = model->logits(ids.slice(1, 0, 5), &cache);
  EXPECT_EQ(cache.length(), 5);
  std::vector<torch::Tensor> steps = {first};
  for (int64_t t = 5; t < 9; ++t) steps.push_back(model->logits(ids.slice(1, t, t + 1), &cache));
  EXPECT_TRUE(torch::allclose(torch::cat(steps, 1), full, 1e-5, 1e-5));
}

// Mistral's sliding window: the cache's step-by-step logits equal the full forward's, and the
// window changes them (a query past it no longer sees the first keys).
TEST(LlamaModel, SlidingWindowHoldsThroughTheKvCache) {
  auto c = tiny_config();
  c.model_type = "mistral";
  c.sliding_window = 3;
  torch::manual_seed(1);
  LlamaForCausalLM model(c);
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 300, {1, 9}, torch::kLong);
  auto full = model->logits(ids);
  LlamaKvCache cache;
  std::vector<torch::Tensor> steps = {model->logits(ids.slice(1, 0, 5), &cache)};
  for (int64_t t = 5; t < 9; ++t) steps.push_back(model->logits(ids.slice(1, t, t + 1), &cache));
  EXPECT_TRUE(torch::allclose(torch::cat(steps, 1), full, 1e-5, 1e-5));
  c.sliding_window = -1;
  torch::manual_seed(1);
  LlamaForCausalLM unwindowed(c);
  const auto all = unwindowed->logits(ids);
  // The first three positions see the same keys either way; later ones do not.
  EXPECT_TRUE(torch::allclose(all.slice(1, 0, 3), full.slice(1, 0, 3), 1e-6, 1e-6));
  EXPECT_FALSE(torch::allclose(all.slice(1, 3), full.slice(1, 3), 1e-3, 1e-3));
}

TEST(LlamaConfig, MistralConfigJsonDefaultsAndRefusals) {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "mistral";
  for (const char* key : {"rope_scaling", "max_position_embeddings", "bos_token_id",
                          "eos_token_id"}) {
    j.erase(key);
  }
  // MistralConfig's defaults: a 4096 window, 131072 positions, BOS 1, EOS 2.
  const auto m = LlamaConfig::from_hf_json(j, "m/config.json");
  EXPECT_EQ(m.model_type, "mistral");
  EXPECT_EQ(m.sliding_window, 4096);
  EXPECT_EQ(m.max_position_embeddings, 131072);
  EXPECT_EQ(m.bos_token_id, 1);
  EXPECT_EQ(m.eos_token_id, 2);
  j["sliding_window"] = nullptr;
  EXPECT_EQ(LlamaConfig::from_hf_json(j, "m/config.json").sliding_window, -1);
  j["sliding_window"] = 64;
  const auto back = m.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "MistralForCausalLM");
  EXPECT_FALSE(back.contains("rope_scaling"));
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  auto scaled = j;
  scaled["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(scaled, "m/config.json"), NotSupportedError,
                    "m/config.json: rope scaling 'linear' is set on a 'mistral' model");
  auto llama = tiny_config().to_hf_json();
  llama["sliding_window"] = 64;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(llama, "l/config.json"), NotSupportedError,
                    "l/config.json: sliding_window is set on a 'llama' model");
  llama["model_type"] = "gemma3";  // the multimodal model
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(llama, "g/config.json"), ModelFileError,
                    "model_type is 'gemma3'; finetune_llama reads 'llama', 'mistral', 'qwen2', "
                    "'qwen2_moe', 'mixtral', 'qwen3', 'qwen3_moe', 'phi3', 'gemma', 'gemma2', "
                    "'gemma3_text', 'deepseek_v2' and 'deepseek_v3' models");
}

// MixtralConfig's defaults (8 experts, 2 per token, no window, rope_theta 1e6, rms 1e-5), its
// config.json round trip, the refusals, and a decoder layer built with a sparse MoE block.
TEST(LlamaConfig, MixtralConfigJsonDefaultsAndRefusals) {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "mixtral";
  for (const char* key : {"rope_scaling", "rope_theta", "rms_norm_eps", "attention_bias",
                          "mlp_bias", "bos_token_id", "eos_token_id"}) {
    j.erase(key);
  }
  const auto m = LlamaConfig::from_hf_json(j, "x/config.json");
  EXPECT_EQ(m.num_local_experts, 8);
  EXPECT_EQ(m.num_experts_per_tok, 2);
  EXPECT_EQ(m.sliding_window, -1);
  EXPECT_EQ(m.rope_theta, 1e6);
  EXPECT_EQ(m.rms_norm_eps, 1e-5);
  EXPECT_EQ(m.bos_token_id, 1);
  const auto back = m.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(back["num_local_experts"], 8);
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  EXPECT_FALSE(m.output_router_logits);
  EXPECT_EQ(m.router_aux_loss_coef, 0.001);
  auto bad = j;
  bad["output_router_logits"] = true;
  bad["router_aux_loss_coef"] = 0.02;
  const auto aux = LlamaConfig::from_hf_json(bad, "x/config.json");
  EXPECT_TRUE(aux.output_router_logits);
  EXPECT_EQ(aux.router_aux_loss_coef, 0.02);
  EXPECT_EQ(aux.to_hf_json()["router_aux_loss_coef"], 0.02);
  bad["router_aux_loss_coef"] = "0.02";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "x/config.json"), ModelFileError,
                    "x/config.json: router_aux_loss_coef is string; expected a number");
  bad = j;
  bad["router_jitter_noise"] = 0.1;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "x/config.json"), NotSupportedError,
                    "router_jitter_noise is 0.1");
  bad = j;
  bad["num_experts_per_tok"] = 9;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "x/config.json"), ModelFileError,
                    "num_experts_per_tok (9) must be in 1..num_local_experts (8)");
  auto c = LlamaConfig::from_hf_json(j, "x/config.json");
  c.num_local_experts = 4;
  torch::manual_seed(0);
  LlamaForCausalLM model(c);
  const auto& layer = *model->model->units[0];
  ASSERT_TRUE(layer.sparse_moe);
  EXPECT_FALSE(layer.mlp);
  EXPECT_EQ(layer.sparse_moe->experts->w1.sizes(),
            (std::vector<int64_t>{4, c.intermediate_size, c.hidden_size}));
  EXPECT_EQ(model->logits(torch::randint(c.vocab_size, {1, 5})).size(1), 5);
}

// Qwen3Config's defaults (head_dim 128 unless given, 32768 positions, no sliding window), its
// round trip and refusals; Qwen3MoeConfig's (128 experts, 8 per token, width 768, no
// renormalisation, every layer sparse), the layers mlp_only_layers and decoder_sparse_step
// leave dense, and transformers 5's name for the expert count.
TEST(LlamaConfig, Qwen3AndQwen3MoeConfigJsonDefaultsAndRefusals) {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "qwen3";
  for (const char* key : {"head_dim", "max_position_embeddings", "mlp_bias"}) j.erase(key);
  j["attention_bias"] = true;
  const auto q = LlamaConfig::from_hf_json(j, "q/config.json");
  EXPECT_EQ(q.head_dim, 128);
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_TRUE(q.qk_norm() && q.qkv_bias() && q.attention_bias);
  EXPECT_FALSE(q.is_sparse_layer(0));
  const auto back = q.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_FALSE(back.contains("mlp_bias"));
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  auto bad = j;
  bad["use_sliding_window"] = true;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "q/config.json"), NotSupportedError,
                    "q/config.json: use_sliding_window is true; finetune_llama's 'qwen3'");
  bad = j;
  bad["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "q/config.json"), NotSupportedError,
                    "layer_types holds \"sliding_attention\"");

  j["model_type"] = "qwen3_moe";
  j["attention_bias"] = false;
  const auto m = LlamaConfig::from_hf_json(j, "m/config.json");
  EXPECT_EQ(m.head_dim, 4);  // Qwen3MoeConfig: hidden_size / heads unless given
  EXPECT_EQ(m.num_local_experts, 128);
  EXPECT_EQ(m.num_experts_per_tok, 8);
  EXPECT_EQ(m.expert_intermediate_size(), 768);
  EXPECT_FALSE(m.norm_topk_prob);
  EXPECT_TRUE(m.is_sparse_layer(0) && m.is_sparse_layer(1));
  j["num_local_experts"] = 6;  // transformers 5 writes num_experts back so
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 12;
  j["norm_topk_prob"] = true;
  j["num_hidden_layers"] = 4;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const auto s = LlamaConfig::from_hf_json(j, "m/config.json");
  EXPECT_EQ(s.num_local_experts, 6);
  EXPECT_TRUE(s.norm_topk_prob);
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(s.is_sparse_layer(i), i == 1) << i;
  const auto moe_back = s.to_hf_json();
  EXPECT_EQ(moe_back["architectures"][0], "Qwen3MoeForCausalLM");
  EXPECT_EQ(moe_back["num_experts"], 6);
  EXPECT_EQ(LlamaConfig::from_hf_json(moe_back, "again").to_hf_json(), moe_back);
  bad = j;
  bad["output_router_logits"] = true;
  EXPECT_TRUE(LlamaConfig::from_hf_json(bad, "m/config.json").output_router_logits);
  bad["num_experts"] = 1;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "m/config.json"), ModelFileError,
                    "num_experts_per_tok (2) must be in 1..num_experts (1)");
  bad = j;
  bad["mlp_only_layers"] = {"3"};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "m/config.json"), ModelFileError,
                    "mlp_only_layers holds \"3\"; expected layer indices");
  bad = j;
  bad["decoder_sparse_step"] = 0;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "m/config.json"), ModelFileError,
                    "decoder_sparse_step is 0");
}

// output_router_logits: the loss is the cross-entropy plus router_aux_loss_coef times the
// load-balancing loss of the sparse layers' router logits (its value against transformers' is
// llama_parity_test's), whose gradient reaches the routers; a token-even router scores 1.
// Under activation checkpointing the loss and every gradient are the same.
TEST(LlamaModel, RouterLoadBalancingLossJoinsTheLoss) {
  const at::Tensor even = at::zeros({8, 4});  // every expert as likely: each share 1/4
  EXPECT_NEAR(router_load_balancing_loss({even}, 4, 1).item<double>(), 1.0, 1e-6);
  auto c = tiny_config();
  c.model_type = "qwen3_moe";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.mlp_only_layers = {1};
  torch::manual_seed(5);
  LlamaForCausalLM plain(c);
  c.output_router_logits = true;
  c.router_aux_loss_coef = 10.0;
  LlamaForCausalLM with_aux(c);
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : plain->named_parameters()) {
      with_aux->named_parameters()[item.key()].copy_(item.value());
    }
  }
  const auto ids = torch::randint(c.vocab_size, {2, 6});
  const auto targets = torch::randint(c.vocab_size, {2, 6});
  const auto base = plain->forward(ids, targets);
  const auto total = with_aux->forward(ids, targets);
  const auto logits = with_aux->model->units[0]->sparse_moe->router_logits();
  ASSERT_TRUE(logits.defined());
  EXPECT_FALSE(plain->model->units[0]->sparse_moe->router_logits().defined());
  const double aux = router_load_balancing_loss({logits}, 4, 2).item<double>();
  EXPECT_GE(aux, 1.0);
  EXPECT_NEAR(total.item<double>(), base.item<double>() + 10.0 * aux, 1e-4);
  base.backward();
  total.backward();
  const auto& g0 = plain->model->units[0]->sparse_moe->gate->weight.grad();
  const auto& g1 = with_aux->model->units[0]->sparse_moe->gate->weight.grad();
  EXPECT_GT((g1 - g0).abs().max().item<double>(), 1e-3);
  // Checkpointed, the same loss and the same gradients: the router logits leave each
  // checkpointed layer with the graph the recomputation rebuilds.
  LlamaForCausalLM checkpointed(c);
  {
    torch::NoGradGuard no_grad;
    for (const auto& item : plain->named_parameters()) {
      checkpointed->named_parameters()[item.key()].copy_(item.value());
    }
  }
  checkpointed->model->set_activation_checkpointing(true);
  const auto again = checkpointed->forward(ids, targets);
  EXPECT_NEAR(again.item<double>(), total.item<double>(), 1e-6);
  again.backward();
  for (const auto& item : with_aux->named_parameters()) {
    const auto& g = checkpointed->named_parameters()[item.key()].grad();
    ASSERT_TRUE(g.defined()) << item.key();
    EXPECT_TRUE(torch::allclose(g, item.value().grad(), 1e-5, 1e-6)) << item.key();
  }
}

// Qwen2MoeConfig's defaults (60 experts, 4 per token, widths 1408 and 5632 for the shared
// expert) and round trip; a layer's block holds the shared expert and its gate under
// transformers' names, and adds sigmoid(gate x) * shared(x) to the routed experts' output.
TEST(LlamaConfig, Qwen2MoeSharedExpertAndConfigJson) {
  auto q = tiny_config();
  q.model_type = "qwen2";
  auto j = q.to_hf_json();
  j["model_type"] = "qwen2_moe";
  const auto d = LlamaConfig::from_hf_json(j, "q/config.json");
  EXPECT_EQ(d.num_local_experts, 60);
  EXPECT_EQ(d.num_experts_per_tok, 4);
  EXPECT_EQ(d.expert_intermediate_size(), 1408);
  EXPECT_EQ(d.shared_expert_intermediate_size, 5632);
  EXPECT_TRUE(d.qkv_bias() && d.qwen_moe() && !d.qk_norm() && !d.norm_topk_prob);
  j["num_experts"] = 4;
  j["num_experts_per_tok"] = 2;
  j["moe_intermediate_size"] = 8;
  j["shared_expert_intermediate_size"] = 12;
  j["mlp_only_layers"] = {1};
  const auto c = LlamaConfig::from_hf_json(j, "q/config.json");
  const auto back = c.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "Qwen2MoeForCausalLM");
  EXPECT_EQ(back["shared_expert_intermediate_size"], 12);
  EXPECT_FALSE(back.contains("head_dim"));
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  auto bad = j;
  bad["shared_expert_intermediate_size"] = 0;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "q/config.json"), ModelFileError,
                    "shared_expert_intermediate_size is 0");

  torch::manual_seed(9);
  LlamaForCausalLM model(c);
  auto& layer = *model->model->units[0];
  ASSERT_TRUE(layer.sparse_moe && layer.shared_expert && layer.shared_expert_gate);
  ASSERT_TRUE(model->model->units[1]->mlp && !model->model->units[1]->shared_expert);
  const auto params = model->named_parameters();
  for (const char* name : {"model.layers.0.mlp.shared_expert.up_proj.weight",
                           "model.layers.0.mlp.shared_expert_gate.weight",
                           "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.w1",
                           "model.layers.0.self_attn.q_proj.bias"}) {
    EXPECT_NE(params.find(name), nullptr) << name;
  }
  EXPECT_EQ(layer.shared_expert->up_proj->weight.sizes(), (std::vector<int64_t>{12, 16}));
  torch::NoGradGuard no_grad;
  const auto x = torch::randn({1, 3, 16});
  const int64_t t = 3;
  const auto cos = torch::ones({t, c.head_dim}), sin = torch::zeros({t, c.head_dim});
  const auto h = x + layer.self_attn(layer.input_layernorm(x), cos, sin, nullptr, nullptr);
  const auto normed = layer.post_attention_layernorm(h);
  const auto shared =
      torch::sigmoid(layer.shared_expert_gate(normed)) * layer.shared_expert(normed);
  EXPECT_GT(shared.abs().max().item<double>(), 1e-4);
  const auto expected = h + layer.sparse_moe(normed) + shared;
  EXPECT_TRUE(torch::allclose(layer.forward(x, cos, sin, nullptr), expected, 1e-6, 1e-6));
}

// transformers 5 writes the rotary base and scaling as rope_parameters: read as rope_theta and
// rope_scaling are, and refused when they contradict the older keys.
TEST(LlamaConfig, RopeParametersOfTransformers5) {
  auto j = tiny_config().to_hf_json();
  j.erase("rope_theta");
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_theta", 500000.0}, {"rope_type", "llama3"}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                          {"original_max_position_embeddings", 32}};
  const auto c = LlamaConfig::from_hf_json(j, "l/config.json");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.rope_type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 32);
  // Read back from the older form it writes, the same config.
  const auto again = LlamaConfig::from_hf_json(c.to_hf_json(), "again");
  EXPECT_EQ(again.rope_theta, 500000.0);
  EXPECT_EQ(again.rope_scaling.rope_type, "llama3");
  auto plain = j;
  plain["rope_parameters"] = {{"rope_theta", 1e6}, {"rope_type", "default"}};
  EXPECT_TRUE(LlamaConfig::from_hf_json(plain, "l/config.json").rope_scaling.is_default());
  EXPECT_EQ(LlamaConfig::from_hf_json(plain, "l/config.json").rope_theta, 1e6);
  auto bad = j;
  bad["rope_theta"] = 10000.0;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "l/config.json"), ModelFileError,
                    "l/config.json: rope_theta (10000) and rope_parameters.rope_theta (500000) "
                    "disagree");
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "l/config.json"), NotSupportedError,
                    "both rope_parameters and rope_scaling are set");
  bad = j;
  bad["rope_parameters"]["mscale"] = 1.0;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "l/config.json"), NotSupportedError,
                    "l/config.json: rope_parameters.mscale is not read for rope_type 'llama3'");
  bad = j;
  bad["model_type"] = "mistral";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "m/config.json"), NotSupportedError,
                    "rope scaling 'llama3' is set on a 'mistral' model");
}

// A Qwen3-MoE's layers: q_norm/k_norm over each head, the sparse layer's MLP under Hugging
// Face's name `mlp` and its experts as `mlp.experts.<e>.gate_proj/up_proj/down_proj`, read back
// from its folder bit-identically; a dense layer (mlp_only_layers) keeps a plain MLP.
TEST(LlamaWeights, Qwen3MoeFolderRoundTripUsesTransformersNames) {
  auto c = tiny_config();
  c.model_type = "qwen3_moe";
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 8;
  c.norm_topk_prob = false;
  c.mlp_only_layers = {1};
  torch::manual_seed(3);
  LlamaForCausalLM ref(c);
  const auto& sparse = *ref->model->units[0];
  ASSERT_TRUE(sparse.sparse_moe && !sparse.mlp);
  EXPECT_EQ(sparse.sparse_moe->experts->w1.sizes(), (std::vector<int64_t>{4, 8, 16}));
  ASSERT_TRUE(ref->model->units[1]->mlp && !ref->model->units[1]->sparse_moe);
  EXPECT_EQ(sparse.self_attn->q_norm->weight.sizes(), (std::vector<int64_t>{c.head_dim}));
  TempDir dir;
  save_hf_weights(*ref, dir.file("hf"), true);
  const auto saved = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  for (const char* name : {"model.layers.0.mlp.gate.weight",
                           "model.layers.0.mlp.experts.3.gate_proj.weight",
                           "model.layers.0.mlp.experts.3.up_proj.weight",
                           "model.layers.0.mlp.experts.3.down_proj.weight",
                           "model.layers.1.mlp.up_proj.weight",
                           "model.layers.1.self_attn.k_norm.weight"}) {
    EXPECT_NE(saved.find(name), nullptr) << name;
  }
  EXPECT_TRUE(torch::equal(*saved.find("model.layers.0.mlp.experts.2.down_proj.weight"),
                           sparse.sparse_moe->experts->w2[2]));
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  EXPECT_EQ(ck.config.mlp_only_layers, std::vector<int64_t>{1});
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(c.vocab_size, {1, 6});
  EXPECT_TRUE(torch::equal(ref->logits(ids), loaded->logits(ids)));
}

LlamaConfig tiny_qwen2() {
  auto c = tiny_config();
  c.model_type = "qwen2";
  c.tie_word_embeddings = false;
  return c;
}

TEST(LlamaConfig, Qwen2ConfigJsonDefaultsAndRefusals) {
  auto j = tiny_qwen2().to_hf_json();
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(j["use_sliding_window"], false);
  for (const char* key : {"head_dim", "attention_bias", "mlp_bias"}) EXPECT_FALSE(j.contains(key));
  EXPECT_EQ(LlamaConfig::from_hf_json(j, "again").to_hf_json(), j);
  j.erase("max_position_embeddings");
  j["sliding_window"] = 4096;  // ignored while use_sliding_window is false, as Qwen2Config does
  j["attention_bias"] = false;  // not a Qwen2Config key: its q/k/v have biases whatever it says
  const auto q = LlamaConfig::from_hf_json(j, "q/config.json");
  EXPECT_EQ(q.max_position_embeddings, 32768);
  EXPECT_EQ(q.sliding_window, -1);
  EXPECT_TRUE(q.qkv_bias());
  EXPECT_FALSE(q.attention_bias);
  j["use_sliding_window"] = true;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(j, "q/config.json"), NotSupportedError,
                    "q/config.json: use_sliding_window is true");
  j["use_sliding_window"] = false;
  j["head_dim"] = 8;  // hidden 16 / 4 heads is 4
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(j, "q/config.json"), NotSupportedError,
                    "q/config.json: head_dim is 8 but a 'qwen2' model's head size is "
                    "hidden_size / num_attention_heads (4)");
  // A Llama's own bias flags: all four attention projections, and the MLP's.
  auto llama = tiny_config().to_hf_json();
  llama["attention_bias"] = true;
  llama["mlp_bias"] = true;
  const auto l = LlamaConfig::from_hf_json(llama, "l/config.json");
  EXPECT_TRUE(l.qkv_bias() && l.attention_bias && l.mlp_bias);
  EXPECT_EQ(l.to_hf_json()["attention_bias"], true);
}

std::vector<std::string> bias_names(torch::nn::Module& model) {
  std::vector<std::string> names;
  for (const auto& item : model.named_parameters()) {
    const auto& k = item.key();
    if (k.size() > 5 && k.compare(k.size() - 5, 5, ".bias") == 0) names.push_back(k);
  }
  return names;
}

// transformers starts biases at zero; random ones show whether they are carried.
void randomize_biases(torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& item : model.named_parameters()) {
    if (item.key().find(".bias") != std::string::npos) item.value().normal_();
  }
}

TEST(LlamaModel, BiasesWhereTheConfigHasThem) {
  LlamaForCausalLM qwen2(tiny_qwen2());
  EXPECT_EQ(bias_names(*qwen2),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj.bias",
                                      "model.layers.0.self_attn.k_proj.bias",
                                      "model.layers.0.self_attn.v_proj.bias",
                                      "model.layers.1.self_attn.q_proj.bias",
                                      "model.layers.1.self_attn.k_proj.bias",
                                      "model.layers.1.self_attn.v_proj.bias"}));
  for (const auto& item : qwen2->named_parameters()) {
    if (item.key().find(".bias") != std::string::npos) {
      EXPECT_EQ(item.value().abs().sum().item<float>(), 0.0f) << "transformers zeroes biases";
    }
  }
  auto c = tiny_config();
  c.attention_bias = true;
  c.mlp_bias = true;
  c.num_hidden_layers = 1;
  LlamaForCausalLM llama(c);
  EXPECT_EQ(bias_names(*llama).size(), 7u);  // q, k, v, o, gate, up, down
  EXPECT_TRUE(bias_names(*LlamaForCausalLM(tiny_config())).empty());
}

// A "qwen2" GGUF: llama.cpp's names with the biases, q/k rows as transformers has them.
TEST(LlamaWeights, Qwen2GgufAndFolderLoadTheBiasesAndUnpermutedRows) {
  TempDir dir;
  auto c = tiny_qwen2();
  torch::manual_seed(7);
  LlamaForCausalLM ref(c);
  randomize_biases(*ref);
  GgufTestWriter w;
  w.kv_str("general.architecture", "qwen2");
  w.kv_u32("qwen2.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.kv_u32("qwen2.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.kv_u32("qwen2.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.kv_u32("qwen2.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.kv_u32("qwen2.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.kv_f32("qwen2.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.kv_u32("qwen2.vocab_size", static_cast<uint32_t>(c.vocab_size));
  for (const auto& item : ref->named_parameters()) {
    const torch::Tensor t = item.value().detach();
    std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
    w.tensor(gguf_tensor_name(item.key()), ne, 0, f32_bytes(t));
  }
  w.write(dir.file("q.gguf"));
  const auto ck = open_llama_checkpoint(dir.file("q.gguf"));
  EXPECT_EQ(ck.config.model_type, "qwen2");
  EXPECT_EQ(ck.config.max_position_embeddings, 32768);  // no context_length: Qwen2Config's
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  // save_hf writes the biases; the folder reads back bit-identically.
  save_hf_weights(*loaded, dir.file("hf"), true);
  const auto back = open_llama_checkpoint(dir.file("hf"));
  EXPECT_EQ(back.config.to_hf_json()["architectures"][0], "Qwen2ForCausalLM");
  LlamaForCausalLM again(back.config, back.weights);
  for (const auto& item : ref->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), again->named_parameters()[item.key()])) << item.key();
}

// A "qwen3moe" GGUF as llama.cpp's converter lays it out: the head size in attention.key_length
// (wider than embedding_length / head_count), the q/k norms, the router as ffn_gate_inp and each
// layer's experts stacked (ffn_gate_exps [E, ffn, hidden] ...). It loads bit-identically, every
// layer sparse and renormalised as llama.cpp runs it; bad expert metadata is named.
TEST(LlamaWeights, Qwen3MoeGgufLoadsStackedExpertsAndTheHeadSize) {
  TempDir dir;
  auto c = tiny_config();
  c.model_type = "qwen3_moe";
  c.tie_word_embeddings = false;
  c.head_dim = 8;  // hidden 16 / 4 heads would be 4
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.moe_intermediate_size = 6;
  torch::manual_seed(11);
  LlamaForCausalLM ref(c);
  const auto write = [&](uint32_t used, const std::string& path) {
    GgufTestWriter w;
    w.kv_str("general.architecture", "qwen3moe");
    w.kv_u32("qwen3moe.block_count", static_cast<uint32_t>(c.num_hidden_layers));
    w.kv_u32("qwen3moe.embedding_length", static_cast<uint32_t>(c.hidden_size));
    w.kv_u32("qwen3moe.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
    w.kv_u32("qwen3moe.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
    w.kv_u32("qwen3moe.attention.key_length", static_cast<uint32_t>(c.head_dim));
    w.kv_u32("qwen3moe.attention.value_length", static_cast<uint32_t>(c.head_dim));
    w.kv_f32("qwen3moe.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
    w.kv_u32("qwen3moe.expert_count", static_cast<uint32_t>(c.num_local_experts));
    w.kv_u32("qwen3moe.expert_used_count", used);
    w.kv_u32("qwen3moe.expert_feed_forward_length", static_cast<uint32_t>(6));
    w.kv_u32("qwen3moe.vocab_size", static_cast<uint32_t>(c.vocab_size));
    for (const auto& item : ref->named_parameters()) {
      const torch::Tensor t = item.value().detach();
      std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
      std::string name = item.key();
      const auto experts = name.find(".mlp.experts.w");
      // model.layers.<i>.mlp.experts.w1 -> blk.<i>.ffn_gate_exps.weight (w2: down, w3: up)
      if (experts != std::string::npos) {
        const char w_index = name.back();
        const char* proj = w_index == '1' ? "gate" : w_index == '2' ? "down" : "up";
        name = "blk." + name.substr(13, experts - 13) + ".ffn_" + proj + "_exps.weight";
      } else {
        name = gguf_tensor_name(name);
      }
      w.tensor(name, ne, 0, f32_bytes(t));
    }
    w.write(path);
  };
  write(2, dir.file("q.gguf"));
  const auto ck = open_llama_checkpoint(dir.file("q.gguf"));
  EXPECT_EQ(ck.config.model_type, "qwen3_moe");
  EXPECT_EQ(ck.config.head_dim, 8);
  EXPECT_EQ(ck.config.expert_intermediate_size(), 6);
  EXPECT_EQ(ck.config.intermediate_size, 6);  // no feed_forward_length: the experts' width
  EXPECT_TRUE(ck.config.norm_topk_prob);
  EXPECT_TRUE(ck.config.is_sparse_layer(0) && ck.config.is_sparse_layer(1));
  EXPECT_EQ(ck.config.max_position_embeddings, 32768);
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
  write(5, dir.file("bad.gguf"));
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("bad.gguf")), ModelFileError,
                    "qwen3moe.expert_used_count (5) must be in 1..qwen3moe.expert_count (4)");
}

// A Mixtral GGUF as llama.cpp writes it: architecture "llama" with expert_count, q/k rows in
// its rotary order, the router as ffn_gate_inp, and the experts stacked (ffn_gate_exps from w1,
// ffn_down_exps from w2, ffn_up_exps from w3) or, in files written before llama.cpp stacked
// them, one tensor per expert (blk.<i>.ffn_gate.<e>.weight). Both load bit-identically as a
// "mixtral" model, every layer sparse and renormalised; a missing expert and bad expert
// metadata are named.
TEST(LlamaWeights, MixtralGgufLoadsStackedAndPerExpertTensors) {
  TempDir dir;
  auto c = tiny_config();
  c.model_type = "mixtral";
  c.tie_word_embeddings = false;
  c.num_local_experts = 4;
  c.num_experts_per_tok = 2;
  c.rope_theta = 1e6;
  torch::manual_seed(13);
  LlamaForCausalLM ref(c);
  struct Layout {
    bool stacked = true;
    uint32_t used = 2;
    uint32_t expert_width = 0;  // expert_feed_forward_length; 0: absent
    bool drop_last_expert = false;
  };
  const auto write = [&](const Layout& l, const std::string& path) {
    const auto experts_metadata = [&](GgufTestWriter& w) {
      w.kv_u32("llama.expert_count", static_cast<uint32_t>(c.num_local_experts));
      w.kv_u32("llama.expert_used_count", l.used);
      if (l.expert_width != 0) w.kv_u32("llama.expert_feed_forward_length", l.expert_width);
    };
    // model.layers.<i>.block_sparse_moe.experts.w1 -> blk.<i>.ffn_gate_exps.weight, or one
    // blk.<i>.ffn_gate.<e>.weight per expert (w2: down, w3: up).
    const auto experts = [&](GgufTestWriter& w, const std::string& name, const torch::Tensor& t) {
      const auto at = name.find(".block_sparse_moe.experts.w");
      const char w_index = name.back();
      const char* proj = w_index == '1' ? "gate" : w_index == '2' ? "down" : "up";
      const std::string blk = "blk." + name.substr(13, at - 13) + ".ffn_" + proj;
      if (l.stacked) {
        std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
        w.tensor(blk + "_exps.weight", ne, 0, f32_bytes(t));
        return;
      }
      for (int64_t e = 0; e < t.size(0) - (l.drop_last_expert ? 1 : 0); ++e) {
        std::vector<uint64_t> ne = {static_cast<uint64_t>(t.size(2)),
                                    static_cast<uint64_t>(t.size(1))};
        w.tensor(blk + "." + std::to_string(e) + ".weight", ne, 0, f32_bytes(t[e]));
      }
    };
    write_gguf(*ref, c, path, c.vocab_size, experts_metadata, experts);
  };
  const auto ids = torch::randint(c.vocab_size, {1, 7});
  for (const bool stacked : {true, false}) {
    SCOPED_TRACE(stacked ? "stacked" : "one tensor per expert");
    const std::string path = dir.file(stacked ? "stacked.gguf" : "legacy.gguf");
    write({stacked, 2, stacked ? static_cast<uint32_t>(c.intermediate_size) : 0}, path);
    const auto ck = open_llama_checkpoint(path);
    EXPECT_EQ(ck.config.model_type, "mixtral");
    EXPECT_EQ(ck.config.num_local_experts, 4);
    EXPECT_EQ(ck.config.num_experts_per_tok, 2);
    EXPECT_EQ(ck.config.expert_intermediate_size(), c.intermediate_size);
    EXPECT_EQ(ck.config.rope_theta, 1e6);
    EXPECT_EQ(ck.config.sliding_window, -1);
    EXPECT_TRUE(ck.config.norm_topk_prob);
    EXPECT_TRUE(ck.config.is_sparse_layer(0) && ck.config.is_sparse_layer(1));
    EXPECT_EQ(ck.config.to_hf_json()["architectures"][0], "MixtralForCausalLM");
    LlamaForCausalLM loaded(ck.config, ck.weights);
    for (const auto& item : ref->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()]))
          << item.key();
    }
    EXPECT_TRUE(torch::equal(ref->logits(ids), loaded->logits(ids)));
  }
  write({false, 2, 0, /*drop_last_expert=*/true}, dir.file("missing.gguf"));
  const auto missing = open_llama_checkpoint(dir.file("missing.gguf"));
  EXPECT_THROW_WITH(LlamaForCausalLM(missing.config, missing.weights), ModelFileError,
                    "expert 3 of 'model.layers.0.block_sparse_moe.experts.3.w1.weight' is in "
                    "neither 'blk.0.ffn_gate_exps.weight' nor 'blk.0.ffn_gate.3.weight'");
  write({true, 5}, dir.file("used.gguf"));
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("used.gguf")), ModelFileError,
                    "llama.expert_used_count (5) must be in 1..llama.expert_count (4)");
  write({true, 2, 7}, dir.file("width.gguf"));
  EXPECT_THROW_WITH(open_llama_checkpoint(dir.file("width.gguf")), NotSupportedError,
                    "'llama.expert_feed_forward_length' (7) differs from "
                    "'llama.feed_forward_length' (24)");
}

// Phi3Config's defaults (4096 positions and original positions, BOS 1, EOS and padding 32000,
// epsilon 1e-5), longrope (also under Phi-3's older name "su") switching to the long factors
// past the original context, the round trip as Phi3Config 4.47 reads it, and the refusals.
LlamaConfig phi3_config() {
  auto c = tiny_config();
  c.model_type = "phi3";
  c.tie_word_embeddings = false;
  c.original_max_position_embeddings = 8;
  c.rope_scaling.rope_type = "longrope";
  c.rope_scaling.short_factor = {1.0, 1.3};
  c.rope_scaling.long_factor = {3.0, 40.0};
  c.rope_scaling.original_max_position_embeddings = 8;
  c.bos_token_id = 1;  // given: Phi3Config's defaults would fill them back otherwise
  c.eos_token_id = 2;
  c.pad_token_id = 0;
  return c;
}

TEST(LlamaConfig, Phi3ConfigJsonDefaultsLongropeAndRefusals) {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "phi3";
  for (const char* key : {"rms_norm_eps", "bos_token_id", "eos_token_id", "rope_scaling",
                          "max_position_embeddings"}) {
    j.erase(key);
  }
  const auto plain = LlamaConfig::from_hf_json(j, "p/config.json");
  EXPECT_EQ(plain.max_position_embeddings, 4096);
  EXPECT_EQ(plain.original_max_position_embeddings, 4096);
  EXPECT_EQ(plain.rms_norm_eps, 1e-5);
  EXPECT_EQ(plain.bos_token_id, 1);
  EXPECT_EQ(plain.eos_token_id, 32000);
  EXPECT_EQ(plain.pad_token_id, 32000);
  EXPECT_EQ(plain.sliding_window, -1);
  EXPECT_TRUE(plain.rope_scaling.is_default());
  j["max_position_embeddings"] = 64;
  j["original_max_position_embeddings"] = 8;
  j["sliding_window"] = 2047;
  j["rope_scaling"] = {{"type", "su"}, {"short_factor", {1.0, 1.3}}, {"long_factor", {3, 40}}};
  const auto c = LlamaConfig::from_hf_json(j, "p/config.json");
  EXPECT_EQ(c.sliding_window, 2047);
  EXPECT_EQ(c.rope_scaling.rope_type, "longrope");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8);
  EXPECT_EQ(c.rope_scaling.long_factor, (std::vector<double>{3.0, 40.0}));
  const auto back = c.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "Phi3ForCausalLM");
  EXPECT_EQ(back["rope_scaling"].size(), 3u);  // Phi3Config 4.47 takes exactly three keys
  EXPECT_EQ(back["rope_scaling"]["type"], "longrope");
  EXPECT_EQ(back["original_max_position_embeddings"], 8);
  EXPECT_FALSE(back.contains("head_dim"));
  auto none = c;
  none.pad_token_id = -1;  // written as null, not left to Phi3Config's 32000
  EXPECT_TRUE(none.to_hf_json().at("pad_token_id").is_null());
  EXPECT_EQ(LlamaConfig::from_hf_json(none.to_hf_json(), "none").pad_token_id, -1);
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  // The short factors within the original context, the long ones past it; the attention factor
  // sqrt(1 + ln(64 / 8) / ln(8)) either way.
  RotaryFrequencies rope(c.rope_scaling, c.rope_theta, c.head_dim, c.max_position_embeddings);
  const auto short_freq = rope.for_length(8).clone();
  const auto long_freq = rope.for_length(9).clone();
  EXPECT_NEAR(short_freq[1].item<double>(), 1.0 / (1.3 * 100.0), 1e-9);
  EXPECT_NEAR(long_freq[1].item<double>(), 1.0 / (40.0 * 100.0), 1e-9);
  EXPECT_TRUE(torch::equal(rope.for_length(3), short_freq));
  EXPECT_DOUBLE_EQ(rope.attention_scaling(), std::sqrt(1 + std::log(8.0) / std::log(8.0)));

  auto bad = j;
  bad["resid_pdrop"] = 0.1;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), NotSupportedError,
                    "p/config.json: resid_pdrop is 0.1; finetune_llama's 'phi3' trains without "
                    "dropout");
  // Phi-4-mini's partial rotation: beside rope_theta, or in transformers 5's rope_parameters.
  auto partial = j;
  partial["hidden_size"] = 32;  // head size 8: 6 features rotated, 3 factors each
  partial.erase("head_dim");
  partial["partial_rotary_factor"] = 0.75;
  partial["rope_scaling"]["short_factor"] = {1.0, 1.1, 1.2};
  partial["rope_scaling"]["long_factor"] = {2.0, 3.0, 4.0};
  const auto phi4 = LlamaConfig::from_hf_json(partial, "p/config.json");
  EXPECT_EQ(phi4.rotary_dim(), 6);
  EXPECT_EQ(phi4.to_hf_json()["partial_rotary_factor"], 0.75);
  auto v5 = partial;
  v5.erase("partial_rotary_factor");
  v5["rope_parameters"] = v5["rope_scaling"];
  v5.erase("rope_scaling");
  v5["rope_parameters"]["partial_rotary_factor"] = 0.75;
  v5["rope_parameters"]["rope_theta"] = 10000.0;
  EXPECT_EQ(LlamaConfig::from_hf_json(v5, "p/config.json").to_hf_json(), phi4.to_hf_json());
  torch::manual_seed(4);
  LlamaForCausalLM partial_model(phi4);
  EXPECT_EQ(partial_model->logits(torch::randint(phi4.vocab_size, {1, 12})).size(1), 12);
  bad = partial;
  bad["rope_scaling"]["long_factor"] = {2.0, 3.0, 4.0, 5.0};  // one per rotated pair
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), ModelFileError,
                    "long_factor has 4 values; rotating 6 features of each head needs 3");
  bad = partial;
  bad["partial_rotary_factor"] = 0.7;  // int(8 * 0.7) = 5 features: odd
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), ModelFileError,
                    "partial_rotary_factor 0.7 rotates 5 of the head's 8 features");
  bad = tiny_config().to_hf_json();
  bad["partial_rotary_factor"] = 0.5;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), NotSupportedError,
                    "partial_rotary_factor is 0.5 on a 'llama' model; finetune_llama reads it on "
                    "'phi3' models");
  bad = j;
  bad["rope_scaling"]["short_factor"] = {1.0, 1.1, 1.2};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), ModelFileError,
                    "rope_scaling.short_factor has 3 values; rotating 4 features of each head "
                    "needs 2");
  bad = j;
  bad["rope_scaling"]["original_max_position_embeddings"] = 16;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), ModelFileError,
                    "original_max_position_embeddings (16) and the config's (8) disagree");
  bad = j;
  bad["model_type"] = "llama";
  bad.erase("sliding_window");
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "p/config.json"), NotSupportedError,
                    "rope scaling 'longrope' is set on a 'llama' model; finetune_llama reads it "
                    "on 'phi3' models");
}

// GemmaConfig's defaults (8192 positions, heads of 256, tied embeddings, BOS 2, EOS 1, padding
// 0), its activation under either name, what it cannot hold refused by name; Gemma 2's and
// Gemma 3's keys; the model's
// RMSNorm weights start at zero, the identity under Gemma's offset (the parity test checks the
// forward against transformers').
TEST(LlamaConfig, GemmaConfigJsonDefaultsAndRefusals) {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "gemma";
  for (const char* key : {"head_dim", "max_position_embeddings", "bos_token_id", "eos_token_id",
                          "pad_token_id", "tie_word_embeddings", "rope_scaling", "mlp_bias"}) {
    j.erase(key);
  }
  j["hidden_act"] = "gelu";  // ignored, as transformers ignores it beside hidden_activation
  const auto c = LlamaConfig::from_hf_json(j, "g/config.json");
  EXPECT_TRUE(c.gemma());
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.eos_token_id, 1);
  EXPECT_EQ(c.pad_token_id, 0);
  const auto back = c.to_hf_json();
  EXPECT_EQ(back["architectures"][0], "GemmaForCausalLM");
  EXPECT_EQ(back["hidden_activation"], "gelu_pytorch_tanh");
  EXPECT_FALSE(back.contains("rope_scaling"));
  EXPECT_EQ(LlamaConfig::from_hf_json(back, "again").to_hf_json(), back);
  auto none = c;
  none.pad_token_id = -1;  // written as null, not left to GemmaConfig's 0
  EXPECT_EQ(LlamaConfig::from_hf_json(none.to_hf_json(), "none").pad_token_id, -1);

  auto bad = j;
  bad["hidden_activation"] = "gelu";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "g/config.json"), NotSupportedError,
                    "g/config.json: hidden_activation is \"gelu\"; finetune_llama's 'gemma' MLP "
                    "is GeGLU with tanh-approximated GELU");
  bad = j;
  bad["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad, "g/config.json"), NotSupportedError,
                    "rope scaling 'linear' is set on a 'gemma' model, whose rotary embedding "
                    "(transformers' GemmaRotaryEmbedding) has none");

  // Gemma 2: Gemma2Config's score scale, window and caps unless given; null caps none; the
  // window in the layers of even index only; another layer_types refused by name.
  auto j2 = j;
  j2["model_type"] = "gemma2";
  const auto g2 = LlamaConfig::from_hf_json(j2, "g2/config.json");
  EXPECT_TRUE(g2.gemma() && g2.gemma2());
  EXPECT_EQ(g2.query_pre_attn_scalar, 256.0);
  EXPECT_EQ(g2.attn_logit_softcapping, 50.0);
  EXPECT_EQ(g2.final_logit_softcapping, 30.0);
  EXPECT_EQ(g2.layer_sliding_window(0), 4096);
  EXPECT_EQ(g2.layer_sliding_window(1), -1);
  const auto back2 = g2.to_hf_json();
  EXPECT_EQ(back2["architectures"][0], "Gemma2ForCausalLM");
  EXPECT_EQ(LlamaConfig::from_hf_json(back2, "again").to_hf_json(), back2);
  j2["final_logit_softcapping"] = nullptr;
  j2["layer_types"] = {"sliding_attention", "full_attention"};
  EXPECT_EQ(LlamaConfig::from_hf_json(j2, "g2/config.json").final_logit_softcapping, 0.0);
  j2["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(j2, "g2/config.json"), NotSupportedError,
                    "layer_types is [\"full_attention\",\"sliding_attention\"]");
  // Gemma 3: no caps unless given, five sliding layers of six rotating with base 1e4, the
  // others with rope_theta (1e6) and rope_scaling; transformers 5's form, one rope object per
  // layer type, reads the same; what it cannot mean here is refused by name.
  auto j3 = j;
  j3["model_type"] = "gemma3_text";
  j3["num_hidden_layers"] = 7;
  j3["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  j3.erase("rope_theta");
  const auto g3 = LlamaConfig::from_hf_json(j3, "g3/config.json");
  EXPECT_TRUE(g3.gemma3() && g3.qk_norm() && g3.sandwich_norms());
  EXPECT_EQ(g3.max_position_embeddings, 131072);
  EXPECT_EQ(g3.attn_logit_softcapping, 0.0);
  EXPECT_EQ(g3.final_logit_softcapping, 0.0);
  EXPECT_EQ(g3.rope_theta, 1e6);
  EXPECT_EQ(g3.rope_local_theta, 1e4);
  EXPECT_EQ(g3.rope_scaling.rope_type, "linear");
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(g3.is_sliding_layer(i), i != 5) << i;
    EXPECT_EQ(g3.rotates_locally(i), i != 5) << i;
  }
  const auto back3 = g3.to_hf_json();
  EXPECT_EQ(back3["architectures"][0], "Gemma3ForCausalLM");
  EXPECT_EQ(LlamaConfig::from_hf_json(back3, "again").to_hf_json(), back3);
  auto v5 = j3;
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  EXPECT_EQ(LlamaConfig::from_hf_json(v5, "g3/config.json").to_hf_json(), back3);
  auto bad3 = v5;
  bad3["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad3, "g3/config.json"), NotSupportedError,
                    "rope_parameters.sliding_attention.rope_type is 'linear'");
  bad3 = j3;
  bad3["layer_types"] = {"sliding_attention"};
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad3, "g3/config.json"), ModelFileError,
                    "expected one entry for each of the 7 layers");
  bad3 = j3;
  bad3["use_bidirectional_attention"] = true;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(bad3, "g3/config.json"), NotSupportedError,
                    "use_bidirectional_attention is true");

  // Gemma 2's capped logits under each form of the loss: the fused one caps each block of
  // logits as the head does, so the loss and every gradient are the same. A cap of 0.5 on
  // logits of order one weighs in (the uncapped loss is far off).
  auto capped = tiny_config();
  capped.model_type = "gemma2";
  capped.final_logit_softcapping = 0.5;
  torch::manual_seed(2);
  LlamaForCausalLM capped_model(capped);
  {
    torch::NoGradGuard no_grad;
    capped_model->model->embed_tokens->weight.normal_(0.0, 1.0);
  }
  const auto ids = torch::randint(capped.vocab_size, {2, 6});
  const auto step = [&](LmLoss form) {
    capped_model->set_lm_loss(form);
    capped_model->zero_grad();
    const auto loss = capped_model->forward(ids, ids);
    loss.backward();
    std::vector<torch::Tensor> out{loss.detach()};
    for (const auto& p : capped_model->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = step(LmLoss::kCrossEntropy);
  for (const LmLoss form : {LmLoss::kFused, LmLoss::kChunked}) {
    const auto other = step(form);
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_TRUE(torch::allclose(other[i], plain[i], 1e-5, 1e-6))
          << "form " << static_cast<int>(form) << " tensor " << i << ": "
          << (other[i] - plain[i]).abs().max().item<double>();
    }
  }
  capped_model->set_lm_loss(LmLoss::kCrossEntropy);
  const double with_cap = plain[0].item<double>();
  capped.final_logit_softcapping = 0.0;
  torch::manual_seed(2);
  LlamaForCausalLM uncapped(capped);
  {
    torch::NoGradGuard no_grad;
    uncapped->model->embed_tokens->weight.normal_(0.0, 1.0);
  }
  EXPECT_GT(std::abs(uncapped->forward(ids, ids).item<double>() - with_cap), 0.1);

  auto small = tiny_config();
  small.model_type = "gemma";
  small.tie_word_embeddings = true;
  torch::manual_seed(3);
  LlamaForCausalLM model(small);
  EXPECT_TRUE(torch::equal(model->model->norm->weight, torch::zeros({small.hidden_size})));
  // A zero offset is the identity: the norm of x is x scaled to unit RMS.
  const auto x = torch::randn({2, small.hidden_size});
  EXPECT_TRUE(torch::allclose(model->model->norm->forward(x),
                              x * torch::rsqrt(x.pow(2).mean(-1, true) + small.rms_norm_eps)));
}

// Phi-3's files fuse q/k/v into qkv_proj and gate/up into gate_up_proj: save_hf writes them so,
// and they load back bit-identically, split by the config's head counts and widths; a fused
// tensor of the wrong size is named.
TEST(LlamaWeights, Phi3FolderFusesQkvAndGateUp) {
  TempDir dir;
  const auto c = phi3_config();
  torch::manual_seed(17);
  LlamaForCausalLM ref(c);
  save_hf_weights(*ref, dir.file("hf"), /*write=*/true);
  auto tensors = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  EXPECT_EQ(tensors.find("model.layers.0.self_attn.q_proj.weight"), nullptr);
  const auto& attn = ref->model->units[1]->self_attn;
  ASSERT_NE(tensors.find("model.layers.1.self_attn.qkv_proj.weight"), nullptr);
  EXPECT_TRUE(torch::equal(tensors["model.layers.1.self_attn.qkv_proj.weight"],
                           torch::cat({attn->q_proj->weight, attn->k_proj->weight,
                                       attn->v_proj->weight})));
  const auto& mlp = ref->model->units[1]->mlp;
  EXPECT_TRUE(torch::equal(tensors["model.layers.1.mlp.gate_up_proj.weight"],
                           torch::cat({mlp->gate_proj->weight, mlp->up_proj->weight})));
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  EXPECT_EQ(ck.config.to_hf_json(), c.to_hf_json());
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()])) << item.key();
  }
  tensors["model.layers.0.mlp.gate_up_proj.weight"] =
      tensors["model.layers.0.mlp.gate_up_proj.weight"].narrow(0, 0, 40).contiguous();
  checkpoint::save_safetensors(tensors, dir.file("hf/model.safetensors"));
  const auto bad = open_llama_checkpoint(dir.file("hf"));
  EXPECT_THROW_WITH(LlamaForCausalLM(bad.config, bad.weights), ModelFileError,
                    "tensor 'model.layers.0.mlp.gate_up_proj.weight' has shape [40, 16]; the "
                    "model config expects 48 rows");
}

// A "phi3" GGUF as llama.cpp's converter writes it: q/k/v fused in attn_qkv (or, as its loader
// also takes them, apart) and gate/up in ffn_up, no row permutation, longrope's factors as
// tensors with their attention factor, the original context and sliding window as metadata, the
// rotated features as rope.dimension_count. It loads to the folder's config and weights; what
// it cannot mean here is named.
struct Phi3Gguf {
  bool fused_qkv = true;
  int64_t rotated = 4;
  float attn_factor = static_cast<float>(std::sqrt(1 + std::log(8.0) / std::log(8.0)));
  bool short_factors = true;
  std::string scaling_type;
};

void write_phi3_gguf(LlamaForCausalLMImpl& model, const LlamaConfig& c, const std::string& path,
                     const Phi3Gguf& o) {
  GgufTestWriter w;
  w.kv_str("general.architecture", "phi3");
  w.kv_u32("phi3.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.kv_u32("phi3.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.kv_u32("phi3.rope.scaling.original_context_length",
           static_cast<uint32_t>(c.original_max_position_embeddings));
  w.kv_u32("phi3.embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.kv_u32("phi3.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.kv_u32("phi3.attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.kv_u32("phi3.attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.kv_f32("phi3.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  w.kv_u32("phi3.rope.dimension_count", static_cast<uint32_t>(o.rotated));
  w.kv_f32("phi3.rope.freq_base", static_cast<float>(c.rope_theta));
  w.kv_u32("phi3.attention.sliding_window", static_cast<uint32_t>(std::max<int64_t>(
                                                 c.sliding_window, 0)));
  w.kv_f32("phi3.rope.scaling.attn_factor", o.attn_factor);
  if (!o.scaling_type.empty()) w.kv_str("phi3.rope.scaling.type", o.scaling_type);
  w.kv_u32("phi3.vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
  w.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_id));
  w.kv_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(c.pad_token_id));
  const auto add = [&](const std::string& name, const torch::Tensor& t) {
    std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
    w.tensor(name, ne, 0, f32_bytes(t.contiguous()));
  };
  const auto factors = [](const std::vector<double>& f) {
    return torch::tensor(std::vector<float>(f.begin(), f.end()));
  };
  add("rope_factors_long.weight", factors(c.rope_scaling.long_factor));
  if (o.short_factors) add("rope_factors_short.weight", factors(c.rope_scaling.short_factor));
  auto params = model.named_parameters();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string blk = "blk." + std::to_string(i) + ".";
    if (o.fused_qkv) {
      add(blk + "attn_qkv.weight", torch::cat({params[hf + "self_attn.q_proj.weight"],
                                               params[hf + "self_attn.k_proj.weight"],
                                               params[hf + "self_attn.v_proj.weight"]}));
    }
    add(blk + "ffn_up.weight", torch::cat({params[hf + "mlp.gate_proj.weight"],
                                           params[hf + "mlp.up_proj.weight"]}));
  }
  for (const auto& item : params) {
    const std::string& name = item.key();
    const bool fused = name.find("gate_proj") != std::string::npos ||
                       name.find("up_proj") != std::string::npos ||
                       (o.fused_qkv && (name.find("q_proj") != std::string::npos ||
                                        name.find("k_proj") != std::string::npos ||
                                        name.find("v_proj") != std::string::npos));
    if (!fused) add(gguf_tensor_name(name), item.value().detach());
  }
  w.write(path);
}

TEST(LlamaWeights, Phi3GgufLoadsFusedOrApartWithLongropeAndPartialRotation) {
  TempDir dir;
  auto c = phi3_config();
  c.sliding_window = 6;
  // f32s in the file: values it holds exactly.
  c.rms_norm_eps = 1.0 / 1024;
  c.rope_scaling.short_factor = {1.0, 1.25};
  torch::manual_seed(19);
  LlamaForCausalLM ref(c);
  for (const bool fused : {true, false}) {
    Phi3Gguf o;
    o.fused_qkv = fused;
    write_phi3_gguf(*ref, c, dir.file("phi3.gguf"), o);
    const auto ck = open_llama_checkpoint(dir.file("phi3.gguf"));
    EXPECT_EQ(ck.config.to_hf_json(), c.to_hf_json()) << "fused q/k/v " << fused;
    LlamaForCausalLM loaded(ck.config, ck.weights);
    for (const auto& item : ref->named_parameters()) {
      EXPECT_TRUE(torch::equal(item.value(), loaded->named_parameters()[item.key()]))
          << item.key() << ", fused q/k/v " << fused;
    }
  }
  // Phi-4-mini's shape: 6 of the head's 8 features rotated.
  auto partial = c;
  partial.hidden_size = 32;
  partial.head_dim = 8;
  partial.partial_rotary_factor = 0.75;
  partial.rope_scaling.short_factor = {1.0, 1.125, 1.25};
  partial.rope_scaling.long_factor = {2.0, 3.0, 4.0};
  LlamaForCausalLM ref_partial(partial);
  Phi3Gguf o;
  o.rotated = 6;
  write_phi3_gguf(*ref_partial, partial, dir.file("phi4.gguf"), o);
  const auto phi4 = open_llama_checkpoint(dir.file("phi4.gguf")).config;
  EXPECT_EQ(phi4.rotary_dim(), 6);
  EXPECT_EQ(phi4.to_hf_json(), partial.to_hf_json());

  const auto refused = [&](const Phi3Gguf& bad, const std::string& needle, bool not_supported) {
    write_phi3_gguf(*ref, c, dir.file("bad.gguf"), bad);
    const auto open = [&] { return GgufFile::open(dir.file("bad.gguf")); };
    if (not_supported) {
      EXPECT_THROW_WITH(LlamaConfig::from_gguf(open()), NotSupportedError, needle);
    } else {
      EXPECT_THROW_WITH(LlamaConfig::from_gguf(open()), ModelFileError, needle);
    }
  };
  Phi3Gguf bad;
  bad.attn_factor = 1.1f;  // the converter's "yarn" form: 0.1 ln(s) + 1
  refused(bad, "metadata 'phi3.rope.scaling.attn_factor' is 1.1", true);
  bad = Phi3Gguf();
  bad.short_factors = false;
  refused(bad, "tensor 'rope_factors_short.weight' is missing; longrope needs both", false);
  bad = Phi3Gguf();
  bad.scaling_type = "yarn";
  refused(bad, "metadata 'phi3.rope.scaling.type' is 'yarn' on a 'phi3' model", true);
  bad = Phi3Gguf();
  bad.rotated = 6;  // past the head's 4 features
  refused(bad, "metadata 'phi3.rope.dimension_count' is 6; expected 1..the head size (4)", false);
}

// A Gemma 2 or Gemma 3 as llama.cpp's converter writes it: its metadata (the caps and window
// only when given), the tensors under gguf's names for the model type, every RMSNorm weight
// plus one, no output.weight (tied).
struct GemmaGguf {
  std::string arch = "gemma2";
  bool caps = true;
  int64_t window = 8;  // 0: no key
  int64_t layers = 0;  // metadata only, with this many layers
};

void write_gemma_gguf(LlamaForCausalLMImpl* model, const LlamaConfig& c, const std::string& path,
                      const GemmaGguf& o) {
  GgufTestWriter w;
  const std::string p = o.arch + ".";
  const int64_t layers = model ? c.num_hidden_layers : o.layers;
  w.kv_str("general.architecture", o.arch);
  w.kv_u32(p + "block_count", static_cast<uint32_t>(layers));
  w.kv_u32(p + "context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.kv_u32(p + "embedding_length", static_cast<uint32_t>(c.hidden_size));
  w.kv_u32(p + "feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  w.kv_u32(p + "attention.head_count", static_cast<uint32_t>(c.num_attention_heads));
  w.kv_u32(p + "attention.head_count_kv", static_cast<uint32_t>(c.num_key_value_heads));
  w.kv_u32(p + "attention.key_length", static_cast<uint32_t>(c.head_dim));
  w.kv_u32(p + "attention.value_length", static_cast<uint32_t>(c.head_dim));
  w.kv_f32(p + "rope.freq_base", static_cast<float>(c.rope_theta));
  w.kv_f32(p + "attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  if (o.caps) {
    if (o.arch == "gemma2") {
      w.kv_f32(p + "attn_logit_softcapping", static_cast<float>(c.attn_logit_softcapping));
    }
    w.kv_f32(p + "final_logit_softcapping", static_cast<float>(c.final_logit_softcapping));
  }
  if (o.window > 0) w.kv_u32(p + "attention.sliding_window", static_cast<uint32_t>(o.window));
  w.kv_u32(p + "vocab_size", static_cast<uint32_t>(c.vocab_size));
  w.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(c.bos_token_id));
  w.kv_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_id));
  w.kv_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(c.pad_token_id));
  const auto add = [&](const std::string& name, const torch::Tensor& t) {
    std::vector<uint64_t> ne(t.sizes().rbegin(), t.sizes().rend());
    w.tensor(name, ne, 0, f32_bytes(t.contiguous()));
  };
  if (model == nullptr) {
    add("token_embd.weight", torch::zeros({c.vocab_size, c.hidden_size}));
  } else {
    for (const auto& item : model->named_parameters()) {
      const std::string& name = item.key();
      const bool norm = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
      torch::Tensor t = item.value().detach();
      add(gguf_tensor_name(name, c.model_type), norm ? t + 1.0 : t);
    }
  }
  w.write(path);
}

LlamaConfig gemma2_config() {
  auto j = tiny_config().to_hf_json();
  j["model_type"] = "gemma2";
  j["head_dim"] = 4;
  j["query_pre_attn_scalar"] = 4;  // llama.cpp's: the head size
  j["sliding_window"] = 8;
  j["attn_logit_softcapping"] = 2.5;
  j["final_logit_softcapping"] = 7.5;
  j["rms_norm_eps"] = 1.0 / 1024;  // an f32 in the file: one it holds exactly
  return LlamaConfig::from_hf_json(j, "gemma2/config.json");
}

TEST(LlamaWeights, GemmaGgufTakesTheNormOffsetOffAndLlamaCppsRules) {
  TempDir dir;
  const LlamaConfig c = gemma2_config();
  torch::manual_seed(23);
  LlamaForCausalLM ref(c);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : ref->parameters()) p.normal_(0.0, 0.5);
  }
  write_gemma_gguf(ref.get(), c, dir.file("gemma2.gguf"), GemmaGguf());
  const auto ck = open_llama_checkpoint(dir.file("gemma2.gguf"));
  EXPECT_EQ(ck.config.to_hf_json(), c.to_hf_json());
  LlamaForCausalLM loaded(ck.config, ck.weights);
  for (const auto& item : ref->named_parameters()) {
    // A norm's weight went through + 1 and - 1 in fp32.
    EXPECT_TRUE(torch::allclose(item.value(), loaded->named_parameters()[item.key()], 0, 2e-7))
        << item.key();
  }
  EXPECT_NE(ref->named_parameters().find("model.layers.1.post_feedforward_layernorm.weight"),
            nullptr);
  EXPECT_EQ(gguf_tensor_name("model.layers.1.pre_feedforward_layernorm.weight", "gemma2"),
            "blk.1.ffn_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.post_attention_layernorm.weight", "gemma3_text"),
            "blk.1.post_attention_norm.weight");
  EXPECT_EQ(gguf_tensor_name("model.layers.1.post_attention_layernorm.weight", "gemma"),
            "blk.1.ffn_norm.weight");

  const auto config_of = [&](const GemmaGguf& o) {
    write_gemma_gguf(nullptr, c, dir.file("meta.gguf"), o);
    return LlamaConfig::from_gguf(GgufFile::open(dir.file("meta.gguf")));
  };
  // Gemma 2 without the keys: llama.cpp's window of 4096 and caps of 50 and 30.
  GemmaGguf bare;
  bare.caps = false;
  bare.window = 0;
  bare.layers = 2;
  auto g = config_of(bare);
  EXPECT_EQ(g.sliding_window, 4096);
  EXPECT_EQ(g.attn_logit_softcapping, 50.0);
  EXPECT_EQ(g.final_logit_softcapping, 30.0);
  EXPECT_EQ(g.query_pre_attn_scalar, 4.0);
  EXPECT_TRUE(g.is_sliding_layer(0));
  EXPECT_FALSE(g.is_sliding_layer(1));
  // The 27B's 46 layers scale by hidden / heads.
  bare.layers = 46;
  EXPECT_EQ(config_of(bare).query_pre_attn_scalar, 16.0 / 4);
  auto wide = c;
  wide.head_dim = 8;  // wider heads than hidden / heads, as Gemma 2 27B's (128 vs 144)
  write_gemma_gguf(nullptr, wide, dir.file("wide.gguf"), bare);
  EXPECT_EQ(LlamaConfig::from_gguf(GgufFile::open(dir.file("wide.gguf"))).query_pre_attn_scalar,
            4.0);
  bare.layers = 2;
  write_gemma_gguf(nullptr, wide, dir.file("wide.gguf"), bare);
  EXPECT_EQ(LlamaConfig::from_gguf(GgufFile::open(dir.file("wide.gguf"))).query_pre_attn_scalar,
            8.0);
  // Gemma 3: five sliding layers of each six, rotating with base 10000; without a window every
  // layer is global.
  GemmaGguf g3;
  g3.arch = "gemma3";
  g3.caps = false;
  g3.layers = 7;
  g = config_of(g3);
  EXPECT_TRUE(g.gemma3());
  EXPECT_EQ(g.sliding_layers, std::vector<bool>({true, true, true, true, true, false, true}));
  EXPECT_EQ(g.sliding_window, 8);
  EXPECT_EQ(g.rope_local_theta, 10000.0);
  EXPECT_EQ(g.final_logit_softcapping, 0.0);
  EXPECT_EQ(g.attn_logit_softcapping, 0.0);
  EXPECT_TRUE(g.rotates_locally(0));
  EXPECT_FALSE(g.rotates_locally(5));
  g3.window = 0;
  g = config_of(g3);
  EXPECT_TRUE(g.sliding_layers.empty());
  EXPECT_FALSE(g.is_sliding_layer(0));
  g3.layers = 62;
  EXPECT_EQ(config_of(g3).query_pre_attn_scalar, 16.0 / 4);
}

// Generating past longrope's original context: the step that crosses it runs the whole
// sequence again with the long factors, as transformers' Phi-3 does, so every token is the
// argmax of a full forward; the cache kept from the short factors would give others.
TEST(LlamaGeneration, LongropeRecomputesTheCacheWhereTheLongFactorsTakeOver) {
  torch::manual_seed(3);
  const auto c = phi3_config();
  LlamaForCausalLM model(c);
  {
    // Weights large enough that the rotation decides the tokens (N(0, 0.02) barely moves them).
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) {
      if (p.dim() == 2) p.normal_(0.0, 0.5);
    }
  }
  const std::vector<int64_t> prompt = {5, 17, 42, 7};
  GenerationOptions greedy;
  greedy.max_new_tokens = 12;
  const auto g = generate(*model, prompt, greedy);
  ASSERT_EQ(g.size(), 12u);
  torch::NoGradGuard no_grad;
  std::vector<int64_t> seq = prompt;
  for (int64_t id : g) {
    EXPECT_EQ(model->logits(torch::tensor(seq).unsqueeze(0))[0][-1].argmax().item<int64_t>(), id)
        << "after " << seq.size() << " tokens";
    seq.push_back(id);
  }
  // Without the recomputation the step past the context sees keys of the short factors.
  LlamaKvCache cache;
  model->logits(torch::tensor(std::vector<int64_t>(seq.begin(), seq.begin() + 8)).unsqueeze(0),
                &cache);
  const auto stale = model->logits(torch::tensor({seq[8]}).unsqueeze(0), &cache)[0][-1];
  const auto fresh =
      model->logits(torch::tensor(std::vector<int64_t>(seq.begin(), seq.begin() + 9))
                        .unsqueeze(0))[0][-1];
  EXPECT_GT((stale - fresh).abs().max().item<double>(), 0.1);
}

// LoRA on biased projections: the bias is loaded with the base weight, stays frozen, and the
// merged export carries it.
TEST(LlamaWeights, LoraOnBiasedProjectionsKeepsAndExportsTheBias) {
  TempDir dir;
  auto c = tiny_qwen2();
  torch::manual_seed(8);
  LlamaForCausalLM ref(c);
  randomize_biases(*ref);
  save_hf_weights(*ref, dir.file("base"), true);
  auto ck = open_llama_checkpoint(dir.file("base"));
  ck.config.lora = linear::LoRAConfig{};
  ck.config.lora->lora_r = 2;
  LlamaForCausalLM lora(ck.config, ck.weights);
  linear::init_lora(*lora);
  const auto& q = lora->model->units[0]->self_attn->q_proj;
  ASSERT_TRUE(q->lora_enabled());
  EXPECT_TRUE(
      torch::equal(q->bias, ref->named_parameters()["model.layers.0.self_attn.q_proj.bias"]));
  EXPECT_FALSE(q->bias.requires_grad());
  torch::NoGradGuard no_grad;
  const auto ids = torch::randint(0, c.vocab_size, {1, 6}, torch::kLong);
  EXPECT_TRUE(torch::allclose(lora->logits(ids), ref->logits(ids), 1e-5, 1e-5));
  save_hf_weights(*lora, dir.file("merged"), true);
  const auto merged = checkpoint::load_safetensors(dir.file("merged/model.safetensors"));
  ASSERT_NE(merged.find("model.layers.1.self_attn.v_proj.bias"), nullptr);
  EXPECT_TRUE(torch::equal(*merged.find("model.layers.1.self_attn.v_proj.bias"),
                           ref->named_parameters()["model.layers.1.self_attn.v_proj.bias"]));
}

TEST(LlamaGeneration, GreedyTopPAndSeededSampling) {
  torch::manual_seed(2);
  LlamaForCausalLM model(tiny_config());
  const std::vector<int64_t> prompt = {5, 17, 42};
  GenerationOptions greedy;
  greedy.max_new_tokens = 6;
  const auto g = generate(*model, prompt, greedy);
  ASSERT_EQ(g.size(), 6u);
  // Greedy is the argmax of the full forward at each step.
  std::vector<int64_t> seq = prompt;
  for (int64_t id : g) {
    torch::NoGradGuard no_grad;
    EXPECT_EQ(model->logits(torch::tensor(seq).unsqueeze(0))[0][-1].argmax().item<int64_t>(), id);
    seq.push_back(id);
  }
  GenerationOptions nucleus = greedy;
  nucleus.temperature = 1.0;
  nucleus.top_p = 1e-9;  // only the most likely token survives
  EXPECT_EQ(generate(*model, prompt, nucleus), g);
  GenerationOptions sampled = greedy;
  sampled.temperature = 5.0;
  sampled.max_new_tokens = 20;
  EXPECT_EQ(generate(*model, prompt, sampled), generate(*model, prompt, sampled));  // same seed
  sampled.eos_token_id = generate(*model, prompt, sampled)[3];
  EXPECT_LE(generate(*model, prompt, sampled).size(), 4u);  // stops after EOS
}

}  // namespace
}  // namespace deepspeed::examples

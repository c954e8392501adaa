// Loading a Llama from GGUF and Hugging Face folders: hyper-parameters from metadata, names and
// the q/k row order undone, the HF folder written by save_hf_weights read back bit-identically,
// and the bad inputs (missing config.json, vocabulary/embedding mismatch).
#include "llama_weights.h"

#include <filesystem>
#include <fstream>

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

// A GGUF file of `model`'s weights (F32), as llama.cpp's converter lays them out.
void write_gguf(LlamaForCausalLMImpl& model, const LlamaConfig& c, const std::string& path,
                int64_t vocab_in_metadata) {
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
  for (const auto& item : model.named_parameters()) {
    torch::Tensor t = item.value().detach();
    const std::string& name = item.key();
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
                    "m/config.json: rope_scaling is set on a 'mistral' model");
  auto llama = tiny_config().to_hf_json();
  llama["sliding_window"] = 64;
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(llama, "l/config.json"), NotSupportedError,
                    "l/config.json: sliding_window is set on a 'llama' model");
  llama["model_type"] = "qwen2";
  EXPECT_THROW_WITH(LlamaConfig::from_hf_json(llama, "q/config.json"), ModelFileError,
                    "model_type is 'qwen2'; finetune_llama reads 'llama' and 'mistral' models");
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

// finetune_llama as a user runs it, on a small randomly initialised Llama written as a Hugging
// Face folder (SmolLM2's tokenizer, so the Austen text tokenizes as for the real model):
// 2 ranks under ZeRO-3 (built inside zero::Init, each layer a unit) train to the same losses and
// weights as 1 rank under ZeRO-0, the held-out loss falls, and --save_hf / --save_dir round-trip.
// A Mixtral, a Qwen3-MoE and a Qwen2-MoE train alike with their experts sharded by AutoEP.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "gguf_file.h"
#include "llama_tokenizer.h"
#include "llama_weights.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed::examples {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kGguf = std::string(DS_SOURCE_DIR) + "/data/SmolLM2-135M-Instruct.Q4_1.gguf";

// A 2-layer Llama (hidden 32, 4 heads, 2 kv heads) with SmolLM2's vocabulary, as a HF folder.
// `moe` "mixtral": a Mixtral of 4 experts per layer, 2 per token; "qwen3_moe": a Qwen3-MoE of 4
// experts of width 32 (2 per token, not renormalised) in layer 1, layer 0 dense
// (mlp_only_layers), heads of 16 (head_dim: the projections are 64 wide) with q/k norms;
// "qwen2_moe": the same experts with Qwen2's attention (q/k/v biases) and a shared expert;
// "deepseek_v3": latent attention, layer 0 dense, layer 1 with 4 experts in 2 groups (2 per
// token within the best group) and a shared expert.
void write_tiny_model(const std::string& dir, const std::string& moe = "",
                      bool router_loss = false) {
  const auto tokenizer = LlamaTokenizer::from_gguf(GgufFile::open(kGguf));
  LlamaConfig c;
  if (!moe.empty()) {
    c.model_type = moe;
    c.num_local_experts = 4;
  }
  c.vocab_size = static_cast<int64_t>(tokenizer.vocab_size());
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = 1e-5;
  c.tie_word_embeddings = true;
  if (moe == "qwen3_moe" || moe == "qwen2_moe") {
    c.moe_intermediate_size = 32;
    c.norm_topk_prob = false;
    c.mlp_only_layers = {0};
  }
  if (moe == "qwen3_moe") c.head_dim = 16;
  if (moe == "qwen2_moe") c.shared_expert_intermediate_size = 48;
  if (moe == "deepseek_v3") {
    c.num_key_value_heads = 4;
    c.q_lora_rank = 16;
    c.kv_lora_rank = 16;
    c.qk_nope_head_dim = 8;
    c.v_head_dim = 8;
    c.moe_intermediate_size = 32;
    c.n_shared_experts = 1;
    c.shared_expert_intermediate_size = 32;
    c.first_k_dense_replace = 1;
    c.topk_method = "noaux_tc";
    c.n_group = 2;
    c.topk_group = 1;
    c.routed_scaling_factor = 2.5;
  }
  c.output_router_logits = router_loss;
  c.router_aux_loss_coef = 0.5;  // weighs in the loss
  c.bos_token_id = tokenizer.bos_token_id();
  c.eos_token_id = tokenizer.eos_token_id();
  torch::manual_seed(7);
  LlamaForCausalLM model(c);
  save_hf_weights(*model, dir, true);
  std::ofstream(dir + "/tokenizer.json") << tokenizer.to_hf_json().dump();
}

std::string config(int stage, int micro, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", micro},
                      {"gradient_accumulation_steps", 1},
                      {"steps_per_print", 100},
                      {"gradient_clipping", 1.0},
                      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 3e-3}, {"weight_decay", 0.0}}}}},
                      {"zero_optimization", {{"stage", stage}, {"stage3_param_persistence_threshold", 0}}}};
  j.merge_patch(extra);
  return j.dump();
}

std::string finetune(const TempDir& dir, int ranks, const std::string& name, const std::string& cfg,
                     const std::string& extra, const std::string& model = "tiny",
                     const std::string& env = "") {
  testing::write_text_file(dir.file(name + ".json"), cfg);
  std::string launcher;
  if (ranks > 1) {
    launcher = std::string(DS_LAUNCHER_BIN) + " --num_gpus " + std::to_string(ranks) +
               " --master_port " + std::to_string(testing::reserve_port()) + " ";
  }
  auto r = run_command(env + "OMP_NUM_THREADS=1 " + launcher + DS_FINETUNE_LLAMA_BIN + " --model " +
                       dir.file(model) + " --deepspeed_config " + dir.file(name + ".json") +
                       " --data " + DS_FIXTURE_TEXT + " --seq_len 32 --eval_batches 2 --metrics_file " +
                       dir.file(name + ".jsonl") + " " + extra);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return r.out;
}

std::vector<double> losses(const std::string& path) {
  std::ifstream in(path);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line)["loss"]);
  return out;
}

std::pair<double, double> held_out(const std::string& out) {
  double a = 0, b = 0;
  const auto at = out.find("held-out loss ");
  EXPECT_NE(at, std::string::npos) << out;
  const auto line = out.substr(out.find("finetune_llama: held-out loss"));
  EXPECT_EQ(std::sscanf(line.c_str(), "finetune_llama: held-out loss %lf -> %lf", &a, &b), 2) << out;
  return {a, b};
}

TEST(FinetuneLlamaE2E, Zero3On2RanksMatchesZero0On1Rank) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  const std::string one = finetune(dir, 1, "zero0", config(0, 4), "--steps 5 --save_hf " + dir.file("hf0"));
  const std::string two = finetune(dir, 2, "zero3", config(3, 2), "--steps 5 --save_hf " + dir.file("hf3") +
                                                                       " --save_dir " + dir.file("ckpt"));
  const auto l0 = losses(dir.file("zero0.jsonl")), l3 = losses(dir.file("zero3.jsonl"));
  ASSERT_EQ(l0.size(), 5u);
  ASSERT_EQ(l3.size(), 5u);
  for (size_t i = 0; i < l0.size(); ++i) {
    EXPECT_NEAR(l3[i], l0[i], 1e-5 * std::abs(l0[i])) << "step " << i + 1;
  }
  // The weights after 5 steps, through --save_hf (gathered from the ZeRO-3 shards). AdamW's
  // update m / sqrt(v) turns last-bit differences of near-zero gradients (summed in another
  // order over 2 ranks) into differences of a small fraction of lr; hence the lr term (within
  // 0.5% of lr on AVX2 machines, 0.6% measured on an AVX-512 one, whose kernels sum in another
  // order).
  const double lr = 3e-3;
  const auto w0 = checkpoint::load_safetensors(dir.file("hf0/model.safetensors"));
  const auto w3 = checkpoint::load_safetensors(dir.file("hf3/model.safetensors"));
  ASSERT_EQ(w0.size(), w3.size());
  for (const auto& item : w0) {
    const auto& other = *w3.find(item.key());
    const double scale = item.value().abs().max().item<double>();
    const double diff = (item.value() - other).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale + 2e-2 * lr) << item.key();
  }
  // Fine-tuning helps on held-out text.
  const auto [before, after] = held_out(two);
  EXPECT_LT(after, before - 0.1) << two;
  const auto [before1, after1] = held_out(one);
  EXPECT_NEAR(before, before1, 1e-5 * before);
  EXPECT_NEAR(after, after1, 1e-5 * after);
  EXPECT_TRUE(std::filesystem::exists(dir.file("ckpt/latest")));
  // The metrics lines carry train_gpt's keys: bytes sent and the memory ledger of every rank.
  std::ifstream in(dir.file("zero3.jsonl"));
  std::string first;
  ASSERT_TRUE(std::getline(in, first));
  const auto row = nlohmann::json::parse(first);
  EXPECT_GT(row.at("comm_bytes").get<int64_t>(), 0) << first;
  ASSERT_EQ(row.at("memory_bytes").at("parameters").size(), 2u) << first;
  EXPECT_GT(row.at("memory_bytes").at("parameters")[0].get<int64_t>(), 0) << first;
  EXPECT_EQ(row.at("rss_bytes"), row.at("memory_bytes").at("rss")) << first;
}

// A Mixtral (4 experts per layer), a Qwen3-MoE, a Qwen2-MoE and a DeepSeek-V3 (4 experts in the
// one sparse layer; the shared experts replicated like any dense weight) with
// DeepSpeed 0.19.8's AutoEP: on 2 ranks with expert_parallel.autoep_size 2 under ZeRO-2, each
// rank holding 2 experts of each sparse layer, the losses are those of one rank with every
// expert; --save_hf gathers the experts back into transformers' names, and --save_dir writes
// DeepSpeed's per-expert files (one set per MoE layer), which resume. Under ZeRO-3 without AutoEP (the
// experts partitioned like any weight), and with it (each rank's experts partitioned over their
// expert-data-parallel group of one), the losses are the same too, and so are the weights
// --save_hf gathers.
class FinetuneMoeE2E : public ::testing::TestWithParam<std::string> {};

TEST_P(FinetuneMoeE2E, AutoEpOn2RanksMatchesOneRank) {
  const bool mixtral = GetParam() == "mixtral";
  TempDir dir;
  write_tiny_model(dir.file("tiny"), GetParam());
  finetune(dir, 1, "zero0", config(0, 4), "--steps 3 --save_hf " + dir.file("hf0"));
  const nlohmann::json ep = {{"expert_parallel", {{"enabled", true}, {"autoep_size", 2}}}};
  const std::string out = finetune(dir, 2, "ep2", config(2, 2, ep),
                                   "--steps 3 --save_hf " + dir.file("hf2") + " --save_dir " +
                                       dir.file("ckpt"));
  // The checkpoint resumes (its module keeps the shared experts and the router: DeepSpeed
  // leaves out only the stacked experts, which the expert files hold).
  const std::string resumed = finetune(dir, 2, "ep2_resumed", config(2, 2, ep),
                                       "--steps 1 --load_dir " + dir.file("ckpt"));
  EXPECT_NE(resumed.find("finetune_llama: loaded"), std::string::npos) << resumed;
  finetune(dir, 2, "zero3", config(3, 2), "--steps 3");
  finetune(dir, 2, "ep2z3", config(3, 2, ep), "--steps 3 --save_hf " + dir.file("hf3"));
  const auto l0 = losses(dir.file("zero0.jsonl"));
  ASSERT_EQ(l0.size(), 3u);
  for (const char* run : {"ep2.jsonl", "zero3.jsonl", "ep2z3.jsonl"}) {
    const auto l = losses(dir.file(run));
    ASSERT_EQ(l.size(), 3u) << run;
    for (size_t i = 0; i < l0.size(); ++i) {
      EXPECT_NEAR(l[i], l0[i], 1e-5 * std::abs(l0[i])) << run << " step " << i + 1;
    }
  }
  const auto w0 = checkpoint::load_safetensors(dir.file("hf0/model.safetensors"));
  for (const char* hf : {"hf2", "hf3"}) {
    const auto w2 = checkpoint::load_safetensors(dir.file(std::string(hf) + "/model.safetensors"));
    ASSERT_EQ(w0.size(), w2.size()) << hf;
    ASSERT_NE(w2.find(mixtral ? "model.layers.1.block_sparse_moe.experts.3.w2.weight"
                              : "model.layers.1.mlp.experts.3.down_proj.weight"),
              nullptr) << hf;
    for (const auto& item : w0) {
      const auto* other = w2.find(item.key());
      ASSERT_NE(other, nullptr) << hf << " " << item.key();
      const double scale = item.value().abs().max().item<double>();
      EXPECT_LE((item.value() - *other).abs().max().item<double>(), 1e-5 * scale + 2e-2 * 3e-3)
          << hf << " " << item.key();
    }
  }
  std::ifstream latest(dir.file("ckpt/latest"));
  std::string tag;
  latest >> tag;
  const int moe_layers = mixtral ? 2 : 1;
  for (int layer = 0; layer <= moe_layers; ++layer) {
    for (int e = 0; e < 4; ++e) {
      EXPECT_EQ(std::filesystem::exists(dir.file("ckpt/" + tag + "/layer_" +
                                                 std::to_string(layer) + "_expert_" +
                                                 std::to_string(e) +
                                                 "_mp_rank_00_model_states.pt")),
                layer < moe_layers)
          << layer << " " << e;
    }
  }
  EXPECT_NE(out.find("held-out loss"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Models, FinetuneMoeE2E,
                         ::testing::Values("mixtral", "qwen3_moe", "qwen2_moe", "deepseek_v3"));

// The router's load-balancing loss under gradient checkpointing, with AutoEP on 2 ranks: the
// recomputed sparse layers (their all-to-alls run again in backward) give the router logits
// their graph back, so the steps are those of the same run without checkpointing.
TEST(FinetuneLlamaE2E, RouterLossUnderActivationCheckpointingWithAutoEp) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"), "qwen3_moe", /*router_loss=*/true);
  const nlohmann::json ep = {{"expert_parallel", {{"enabled", true}, {"autoep_size", 2}}}};
  finetune(dir, 2, "plain", config(2, 2, ep), "--steps 3");
  finetune(dir, 2, "ckpt", config(2, 2, ep), "--steps 3 --activation_checkpointing");
  const auto plain = losses(dir.file("plain.jsonl")), ckpt = losses(dir.file("ckpt.jsonl"));
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(ckpt.size(), 3u);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_NEAR(ckpt[i], plain[i], 1e-5 * std::abs(plain[i])) << "step " << i + 1;
  }
}

// Gradient checkpointing (each layer recomputed in backward) under ZeRO-3 on 2 ranks takes the
// steps of plain ZeRO-0 on 1 rank.
TEST(FinetuneLlamaE2E, ActivationCheckpointingUnderZero3MatchesZero0) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  finetune(dir, 1, "zero0", config(0, 4), "--steps 3");
  const std::string out = finetune(dir, 2, "ckpt3", config(3, 2), "--steps 3 --activation_checkpointing");
  const auto l0 = losses(dir.file("zero0.jsonl")), l3 = losses(dir.file("ckpt3.jsonl"));
  ASSERT_EQ(l0.size(), 3u);
  ASSERT_EQ(l3.size(), 3u);
  for (size_t i = 0; i < l0.size(); ++i) EXPECT_NEAR(l3[i], l0[i], 1e-5 * std::abs(l0[i])) << "step " << i + 1;
}

// ZeRO-2 with the optimizer offloaded to the CPU (CPU-Adam) takes the same steps.
TEST(FinetuneLlamaE2E, Zero2WithCpuOffloadOn2RanksMatchesZero0On1Rank) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  finetune(dir, 1, "zero0", config(0, 4), "--steps 3");
  finetune(dir, 2, "zero2", config(2, 2, {{"zero_optimization", {{"offload_optimizer", {{"device", "cpu"}}}}}}),
           "--steps 3");
  const auto l0 = losses(dir.file("zero0.jsonl")), l2 = losses(dir.file("zero2.jsonl"));
  ASSERT_EQ(l0.size(), 3u);
  ASSERT_EQ(l2.size(), 3u);
  for (size_t i = 0; i < l0.size(); ++i) EXPECT_NEAR(l2[i], l0[i], 1e-5 * std::abs(l0[i])) << "step " << i + 1;
}

// bf16 under ZeRO-3: the layers run in bf16 (RMSNorm and softmax in fp32) and still learn, on
// LibTorch's own bf16 path of this CPU and on the one of AVX2-only CPUs, where LibTorch 1.13's
// GEMM accumulates in bf16 and the engine computes fp32 products instead
// (runtime/precision/cpu_bf16_matmul.h). There, with LibTorch's GEMM, the held-out loss rose over
// the 5 steps (10.70 -> 10.81, measured on an AVX2-only AMD EPYC).
TEST(FinetuneLlamaE2E, Bf16UnderZero3Learns) {
  for (const bool without_onednn : {false, true}) {
    SCOPED_TRACE(without_onednn ? "LibTorch's GEMM without oneDNN" : "this CPU's bf16 path");
    TempDir dir;
    write_tiny_model(dir.file("tiny"));
    const std::string env = without_onednn ? "DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN=1 " : "";
    const std::string out =
        finetune(dir, 2, "bf16", config(3, 2, {{"bf16", {{"enabled", true}}}}),
                 "--steps 5 --prompt 'It is' --max_new_tokens 4", "tiny", env);
    const auto [before, after] = held_out(out);
    EXPECT_LT(after, before - 0.1) << out;
    EXPECT_NE(out.find("after fine-tuning: It is"), std::string::npos) << out;
    if (without_onednn) {
      EXPECT_NE(out.find("computed as fp32 products rounded to bf16"), std::string::npos) << out;
    }
  }
}

// hybrid_engine under ZeRO-3 on 2 ranks: generation goes through engine->generate_with, each layer
// gathered once per generation (pin_parameters), and gives the tokens of the plain ZeRO-3 run;
// the second eval() prints DeepSpeed's latency line for the first generation and the training.
TEST(FinetuneLlamaE2E, HybridEngineGeneratesTheSameTokensUnderZero3) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  const std::string flags = "--steps 1 --prompt 'It is a truth' --max_new_tokens 6 --generation_file ";
  const std::string plain = finetune(dir, 2, "plain", config(3, 2), flags + dir.file("plain_gen.json"));
  const std::string hybrid =
      finetune(dir, 2, "hybrid", config(3, 2, {{"hybrid_engine", {{"enabled", true}, {"pin_parameters", true}}}}),
               flags + dir.file("hybrid_gen.json"));
  std::ifstream p(dir.file("plain_gen.json")), h(dir.file("hybrid_gen.json"));
  const auto want = nlohmann::json::parse(p), got = nlohmann::json::parse(h);
  ASSERT_EQ(want["token_ids"].size(), 6u) << want;
  EXPECT_EQ(got["token_ids"], want["token_ids"]);
  // Samples/s are counted only for generations through generate_with (its batch size).
  for (const char* part : {"|E2E latency=", "|Generate time=", "|Training time=", "|CurSamplesPerSec="}) {
    EXPECT_NE(hybrid.find(part), std::string::npos) << part << "\n" << hybrid;
    EXPECT_EQ(plain.find(part), std::string::npos) << part;
  }
}

TEST(FinetuneLlamaE2E, SaveHfFolderLoadsBackBitIdentically) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  finetune(dir, 1, "export", config(0, 2), "--steps 2 --save_hf " + dir.file("hf"));
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir.file(std::string("hf/") + f))) << f;
  }
  const auto ck = open_llama_checkpoint(dir.file("hf"));
  LlamaForCausalLM model(ck.config, ck.weights);
  const auto saved = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  for (const auto& item : model->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), *saved.find(item.key()))) << item.key();
  }
  // And as input again: --steps 0 --save_hf writes the same tensors.
  finetune(dir, 1, "again", config(0, 2), "--steps 0 --save_hf " + dir.file("hf2"), "hf");
  const auto again = checkpoint::load_safetensors(dir.file("hf2/model.safetensors"));
  for (const auto& item : saved) EXPECT_TRUE(torch::equal(item.value(), *again.find(item.key()))) << item.key();
}

// LoRA (deepspeed::linear): adapters on every decoder projection, everything else frozen. On 2
// ranks under ZeRO-2 with the base weights sharded over them, and under ZeRO-3 unsharded, the
// losses are those of one rank; --save_hf writes the merged weights (W + alpha/r B A), which
// load as a plain model with the trained model's held-out loss, the frozen tensors untouched.
TEST(FinetuneLlamaE2E, LoraOn2RanksShardedOrUnderZero3MatchesOneRankAndMerges) {
  TempDir dir;
  write_tiny_model(dir.file("tiny"));
  const std::string lora = "--steps 5 --lora_r 4 --lora_alpha 8 ";
  const std::string one =
      finetune(dir, 1, "lora0", config(0, 4), lora + "--save_hf " + dir.file("hf"));
  finetune(dir, 2, "lora2", config(2, 2), lora + "--lora_base_weight_sharding 2");
  finetune(dir, 2, "lora3", config(3, 2), lora);
  const auto l0 = losses(dir.file("lora0.jsonl"));
  ASSERT_EQ(l0.size(), 5u);
  for (const char* other : {"lora2.jsonl", "lora3.jsonl"}) {
    const auto l = losses(dir.file(other));
    ASSERT_EQ(l.size(), 5u) << other;
    for (size_t i = 0; i < l0.size(); ++i) {
      EXPECT_NEAR(l[i], l0[i], 1e-5 * std::abs(l0[i])) << other << " step " << i + 1;
    }
  }
  const auto [before, after] = held_out(one);
  EXPECT_NE(before, after);
  const auto base = checkpoint::load_safetensors(dir.file("tiny/model.safetensors"));
  const auto merged = checkpoint::load_safetensors(dir.file("hf/model.safetensors"));
  ASSERT_EQ(base.size(), merged.size());  // no adapter tensors: merged into the projections
  for (const auto& item : base) {
    const bool projection = item.key().find("_proj.") != std::string::npos;
    EXPECT_EQ(torch::equal(item.value(), *merged.find(item.key())), !projection) << item.key();
  }
  std::ofstream(dir.file("hf/tokenizer.json"))
      << std::ifstream(dir.file("tiny/tokenizer.json")).rdbuf();
  const std::string again = finetune(dir, 1, "merged", config(0, 4), "--steps 1", "hf");
  double start = 0;
  ASSERT_EQ(std::sscanf(again.substr(again.find("step 0 | held-out loss")).c_str(),
                        "step 0 | held-out loss %lf", &start), 1) << again;
  EXPECT_NEAR(start, after, 1e-4) << again;  // both printed to 4 decimals
}

}  // namespace
}  // namespace deepspeed::examples

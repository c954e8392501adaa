// finetune_llama against transformers on the real SmolLM2-135M-Instruct GGUF (both sides
// dequantise the same file): the tokenizer's ids, the logits of a prompt (fp32, 1e-4), the
// --score_file loss (1e-4 relative), 20 greedy tokens with the KV cache (identical), and the
// --save_hf folder (loads in transformers to the same logits; our loader reads it back
// bit-identically). Then the same on small random Llama 2, Mistral, Mixtral, Qwen2, Qwen2-MoE,
// Qwen3, Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3 folders, and Qwen2, Qwen3 and Qwen3-MoE GGUFs (hf_folder_reference.py).
// The model file and the Python environments come from the CTest fixtures llama_model_file,
// llama_python_refs and deepspeed_peer_torch2 (scripts/fetch_smollm2.sh,
// scripts/setup_python_refs.sh, scripts/setup_deepspeed_peer.sh --torch2).
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "gguf_file.h"
#include "llama_tokenizer.h"
#include "llama_weights.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kModel = std::string(DS_SOURCE_DIR) + "/data/SmolLM2-135M-Instruct.Q4_1.gguf";
const std::string kPython = std::string(DS_SOURCE_DIR) + "/.venv/bin/python";
// transformers 5.15 on torch 2.11, for the models transformers 4.47 lacks (Qwen3, Qwen3-MoE).
const std::string kPython5 = std::string(DS_SOURCE_DIR) + "/.venv-deepspeed-torch2/bin/python";
const std::string kPrompt = "The capital of France is";
const std::string kScoreFile = std::string(DS_SOURCE_DIR) + "/tests/data/austen_slice.txt";
const std::vector<std::string> kTexts = {
    "Hello world, it's 2024! <|im_start|>user\nhi<|im_end|>",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune",
    "  multiple   spaces\n\n\ttabs, caf\xC3\xA9, na\xC3\xAFve, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E, "
    "emoji \xF0\x9F\x99\x82, 3.14159, don't you'll I'M",
    "control \x04\x05 bytes\x01 and \x7F end",
};

nlohmann::json run_reference(const std::string& model, const std::string& out,
                             const std::string& python = kPython) {
  std::string cmd = "OMP_NUM_THREADS=2 " + python + " " + DS_LLAMA_REFERENCE_PY + " --model '" +
                    model + "' --out '" + out + "' --prompt '" + kPrompt + "' --max_new_tokens 20" +
                    " --score_file '" + kScoreFile + "' --seq_len 64 --encode_json '" + out +
                    ".texts.json'";
  // Through a file: a shell would mangle the control characters.
  std::ofstream(out + ".texts.json") << nlohmann::json(kTexts).dump();
  auto r = run_command(cmd + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

// finetune_llama on `model` with nothing to train, then what `args` ask (its output).
std::string run_finetune(const std::string& model, const std::string& args) {
  auto r = run_command(std::string("OMP_NUM_THREADS=2 ") + DS_FINETUNE_LLAMA_BIN +
                       " --deepspeed_config " + DS_LLAMA_STAGE0_CONFIG + " --model '" + model +
                       "' --steps 0 " + args + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out;
  return r.out;
}

// The --score_file line of `out` holds the reference's loss (1e-4 relative) and token count.
void expect_score_as(const nlohmann::json& ref, const std::string& out) {
  double loss = 0;
  long long n = 0;
  const size_t at = out.find("score: ");
  ASSERT_NE(at, std::string::npos) << out;
  ASSERT_EQ(std::sscanf(out.substr(at).c_str(), "score: loss=%lf tokens=%lld", &loss, &n), 2)
      << out;
  EXPECT_NEAR(loss, ref["score"]["loss"].get<double>(), 1e-4 * ref["score"]["loss"].get<double>());
  EXPECT_EQ(n, ref["score"]["tokens"].get<long long>());
}

class LlamaParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(kModel)) << kModel << " (run scripts/fetch_smollm2.sh)";
    ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " (run scripts/setup_python_refs.sh)";
    dir_ = new TempDir("llama_parity");
    ref_ = new nlohmann::json(run_reference(kModel, dir_->file("ref.json")));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete dir_;
  }
  static std::string finetune(const std::string& args) {
    auto r = run_command(std::string("OMP_NUM_THREADS=2 ") + DS_FINETUNE_LLAMA_BIN +
                         " --deepspeed_config " + DS_LLAMA_STAGE0_CONFIG + " " + args);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return r.out;
  }
  static TempDir* dir_;
  static nlohmann::json* ref_;
};
TempDir* LlamaParity::dir_ = nullptr;
nlohmann::json* LlamaParity::ref_ = nullptr;

TEST_F(LlamaParity, TokenizerEncodesAsTransformers) {
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(kModel));
  EXPECT_EQ(tok.encode(kPrompt), (*ref_)["prompt_ids"].get<std::vector<int64_t>>());
  ASSERT_EQ((*ref_)["tokens"].size(), kTexts.size());
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(tok.encode(kTexts[i]), (*ref_)["tokens"][i].get<std::vector<int64_t>>()) << kTexts[i];
  }
}

TEST_F(LlamaParity, LogitsMatchTransformersWithin1e4) {
  const auto ck = open_llama_checkpoint(kModel);
  LlamaForCausalLM model(ck.config, ck.weights);
  torch::NoGradGuard no_grad;
  const auto ids = (*ref_)["prompt_ids"].get<std::vector<int64_t>>();
  auto ours = model->logits(torch::tensor(ids, torch::kLong).unsqueeze(0))[0];
  std::vector<std::vector<float>> rows = (*ref_)["logits"].get<std::vector<std::vector<float>>>();
  auto theirs = torch::empty_like(ours);
  for (size_t i = 0; i < rows.size(); ++i) theirs[static_cast<int64_t>(i)] = torch::tensor(rows[i]);
  const double diff = (ours - theirs).abs().max().item<double>();
  std::printf("max |logit difference| = %.3g over %lld logits\n", diff, (long long)ours.numel());
  EXPECT_LT(diff, 1e-4);
}

TEST_F(LlamaParity, ScoreAndGreedyGenerationMatchTransformers) {
  expect_score_as(*ref_, run_finetune(kModel, "--seq_len 64 --score_file " + kScoreFile));

  const std::string gen_file = dir_->file("gen.json");
  finetune("--model " + kModel + " --steps 0 --prompt '" + kPrompt +
           "' --max_new_tokens 20 --generation_file " + gen_file);
  std::ifstream in(gen_file);
  const auto gen = nlohmann::json::parse(in);
  EXPECT_EQ(gen["prompt"], kPrompt);
  EXPECT_EQ(gen["token_ids"].get<std::vector<int64_t>>(), (*ref_)["generated"].get<std::vector<int64_t>>());
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(kModel));
  EXPECT_EQ(gen["text"].get<std::string>(), tok.decode(gen["token_ids"].get<std::vector<int64_t>>(), true));
}

// --save_hf of the GGUF model: transformers loads the folder as is (model and tokenizer) and
// gets the GGUF's logits and ids; our loader reads the folder back bit-identically.
TEST_F(LlamaParity, SaveHfFolderLoadsInTransformersWithTheSameLogits) {
  const std::string hf = dir_->file("hf");
  finetune("--model " + kModel + " --steps 0 --save_hf " + hf);
  const auto hf_ref = run_reference(hf, dir_->file("hf_ref.json"));
  EXPECT_EQ(hf_ref["prompt_ids"], (*ref_)["prompt_ids"]);
  EXPECT_EQ(hf_ref["tokens"], (*ref_)["tokens"]);
  EXPECT_EQ(hf_ref["generated"], (*ref_)["generated"]);
  const auto a = (*ref_)["logits"].get<std::vector<std::vector<float>>>();
  const auto b = hf_ref["logits"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(a.size(), b.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j) diff = std::max(diff, double(std::abs(a[i][j] - b[i][j])));
  EXPECT_LT(diff, 1e-4);

  const auto gguf = open_llama_checkpoint(kModel);
  const auto back = open_llama_checkpoint(hf);
  EXPECT_EQ(back.config.to_hf_json(), gguf.config.to_hf_json());
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.29.self_attn.k_proj.weight", "model.norm.weight"}) {
    EXPECT_TRUE(torch::equal(back.weights(name), gguf.weights(name))) << name;
  }
}

// finetune_llama on `model` scores kScoreFile and greedily generates after kPrompt (into
// `gen_file`) as the reference did.
void expect_scores_and_generates_as(const nlohmann::json& ref, const std::string& model,
                                    const std::string& gen_file) {
  expect_score_as(ref, run_finetune(model, "--seq_len 64 --score_file " + kScoreFile));
  run_finetune(model, "--prompt '" + kPrompt + "' --max_new_tokens 20 --generation_file " +
                          gen_file);
  std::ifstream in(gen_file);
  ASSERT_TRUE(in.good()) << gen_file;
  EXPECT_EQ(nlohmann::json::parse(in)["token_ids"], ref["generated"]);
}

// A folder shaped as Llama 2's, Mistral's or Mixtral's (random weights, a SentencePiece-style
// tokenizer.json with the legacy normalizer and byte fallback; Mistral's sliding window of 12
// positions, shorter than the 64 scored tokens and the 12 + 20 of the generation; Mixtral's
// sparse MoE blocks of 4 experts, 2 per token) or Qwen2's (q/k/v biases, a
// byte-level tokenizer.json with NFC and Qwen2's pattern), Qwen3's (an explicit head_dim, q/k
// norms; against transformers 5, whose config.json keeps the rotary base in rope_parameters)
// and Qwen3-MoE's (sparse and dense layers, experts as `mlp.experts.<e>.gate_proj`), and
// Qwen2-MoE's (Qwen2's attention, a gated shared expert beside the routed ones), Mistral NeMo's
// (heads wider than hidden_size / heads, no window, a byte-level tokenizer on Mistral's Tekken
// pattern), Gemma's (embeddings scaled, RMSNorm weights as offsets from one, GeGLU, tied
// embeddings; a SentencePiece-style tokenizer that prepends nothing) and Gemma 2's (its extra
// norms, a window of 32 in layer 0 only, soft-capped scores and logits, its scores scaled by
// query_pre_attn_scalar; against transformers 5) and Gemma 3's (q/k norms, a sliding layer
// rotating with a base of its own and a global one with linear scaling), and Phi-3's (q/k/v and
// gate/up fused in its files; longrope, its original context of 16 positions passed by the 64
// scored tokens and crossed by the generation, whose cache transformers then recomputes with
// the long factors; and as Phi-4-mini's, 3/4 of each head rotated, with a byte-level tokenizer
// on GPT-4o's pattern, against transformers 5, whose generation stays within the original
// context of 48), and DeepSeek-V2's and V3's (multi-head latent attention, V3's through a query
// bottleneck, yarn moving both the rotation and the softmax scale, a dense and a sparse layer
// with shared experts and group-limited routing, V3's by sigmoid with a score correction bias;
// against transformers 5):
// finetune_llama tokenizes, scores and greedily generates as transformers does, decodes the
// generation to transformers' text, and its --save_hf folder loads in transformers to the same
// ids and generation.
class LlamaFolderParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaFolderParity, ScoresGeneratesAndSavesAsTransformers) {
  // transformers 5: Qwen3, Gemma 3 and the DeepSeeks, which 4.47 lacks, Phi-4-mini's partial rotation, which it
  // ignores, and Gemma 2, whose 4.47 generation cache needs torch 2.
  const bool transformers5 = GetParam().rfind("qwen3", 0) == 0 || GetParam() == "phi4_mini" ||
                             GetParam() == "gemma2" || GetParam() == "gemma3" ||
                             GetParam().rfind("deepseek", 0) == 0;
  const bool byte_level = GetParam().rfind("qwen", 0) == 0 || GetParam() == "phi4_mini" ||
                          GetParam() == "mistral_nemo";
  const std::string python = transformers5 ? kPython5 : kPython;
  ASSERT_TRUE(std::filesystem::exists(python))
      << python << " (run scripts/setup_python_refs.sh, scripts/setup_deepspeed_peer.sh --torch2)";
  TempDir dir("llama2_folder");
  const std::string model = dir.file(GetParam());
  const auto made = run_command(python + " " + DS_HF_FOLDER_REFERENCE_PY + " " + kScoreFile +
                                " '" + model + "' " + GetParam() + " 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const auto ref = run_reference(model, dir.file("ref.json"), python);
  const auto tok = LlamaTokenizer::from_hf_json(model + "/tokenizer.json");
  ASSERT_EQ(tok.sentencepiece_style(), !byte_level);
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(tok.encode(kTexts[i]), ref["tokens"][i].get<std::vector<int64_t>>()) << kTexts[i];
  }
  const auto finetune = [&](const std::string& args) { return run_finetune(model, args); };
  expect_score_as(ref, finetune("--seq_len 64 --score_file " + kScoreFile));

  const std::string gen_file = dir.file("gen.json"), saved = dir.file("saved");
  finetune("--prompt '" + kPrompt + "' --max_new_tokens 20 --generation_file " + gen_file +
           " --save_hf " + saved);
  std::ifstream in(gen_file);
  const auto gen = nlohmann::json::parse(in);
  EXPECT_EQ(gen["token_ids"], ref["generated"]);
  // transformers' decode of the same ids (its Llama decoder strips the leading space).
  const auto decoded = run_command(
      python + " -c \"import json,sys; from transformers import AutoTokenizer; "
      "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
      "print(json.dumps(t.decode(json.loads(sys.argv[2]), skip_special_tokens=True)))\" '" +
      model + "' '" + ref["generated"].dump() + "' 2>/dev/null");
  ASSERT_EQ(decoded.exit_code, 0) << decoded.out;
  EXPECT_EQ(gen["text"], nlohmann::json::parse(decoded.out));
  const auto saved_ref = run_reference(saved, dir.file("saved_ref.json"), python);
  EXPECT_EQ(saved_ref["tokens"], ref["tokens"]);
  EXPECT_EQ(saved_ref["prompt_ids"], ref["prompt_ids"]);
  EXPECT_EQ(saved_ref["generated"], ref["generated"]);
  std::ifstream config_in(saved + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(config_in)["model_type"],
            GetParam() == "llama2"         ? "llama"
            : GetParam() == "phi4_mini"    ? "phi3"
            : GetParam() == "mistral_nemo" ? "mistral"
            : GetParam() == "gemma3"       ? "gemma3_text"
                                           : GetParam());
}

INSTANTIATE_TEST_SUITE_P(Kinds, LlamaFolderParity,
                         ::testing::Values("llama2", "deepseek_v2", "deepseek_v3", "gemma",
                                           "gemma2", "gemma3", "mistral", "mistral_nemo",
                                           "mixtral", "phi3", "phi4_mini", "qwen2", "qwen2_moe",
                                           "qwen3", "qwen3_moe"));

// The same Qwen2, Qwen2-MoE, Qwen3 and Qwen3-MoE as llama.cpp lays them out in a GGUF file
// (Qwen3's head size as attention.key_length, its q/k norms as attn_q_norm/attn_k_norm, the MoEs'
// routers as ffn_gate_inp and each layer's experts stacked in ffn_gate_exps/ffn_up_exps/
// ffn_down_exps, Qwen2-MoE's shared expert as ffn_*_shexp and its gate as the vector
// ffn_gate_inp_shexp), read by transformers' GGUF loader (its Qwen2 tokenizer: NFC, Qwen2's
// pattern, three special tokens, no BOS) and by ours.
class QwenGgufParity : public ::testing::TestWithParam<std::string> {};

TEST_P(QwenGgufParity, ScoresAndGeneratesAsTransformersGgufLoader) {
  const std::string python = GetParam() == "qwen2" ? kPython : kPython5;
  ASSERT_TRUE(std::filesystem::exists(python)) << python;
  TempDir dir("qwen_gguf");
  const std::string gguf = dir.file(GetParam() + ".gguf");
  const auto made = run_command(python + " " + DS_HF_FOLDER_REFERENCE_PY + " " + kScoreFile +
                                " '" + dir.file("folder") + "' " + GetParam() + " '" + gguf +
                                "' 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  const auto ref = run_reference(gguf, dir.file("ref.json"), python);
  const auto file = GgufFile::open(gguf);
  const auto tok = LlamaTokenizer::from_gguf(file);
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(tok.encode(kTexts[i]), ref["tokens"][i].get<std::vector<int64_t>>()) << kTexts[i];
  }
  // The GGUF holds the folder's weights: both load to the same config (but the padding token,
  // which only the GGUF names, and the RMSNorm epsilon, an f32 there) and tensors.
  const auto from_gguf = open_llama_checkpoint(gguf);
  const auto from_folder = open_llama_checkpoint(dir.file("folder"));
  EXPECT_NEAR(from_gguf.config.rms_norm_eps, from_folder.config.rms_norm_eps, 1e-12);
  auto gguf_config = from_gguf.config.to_hf_json(), folder_config = from_folder.config.to_hf_json();
  for (const char* key : {"pad_token_id", "rms_norm_eps"}) {
    gguf_config.erase(key);
    folder_config.erase(key);
  }
  EXPECT_EQ(gguf_config, folder_config);
  std::vector<std::string> names = {"model.layers.1.self_attn.q_proj.weight", "lm_head.weight"};
  const bool qwen2 = GetParam() == "qwen2" || GetParam() == "qwen2_moe";
  names.push_back(qwen2 ? "model.layers.1.self_attn.k_proj.bias"
                        : "model.layers.1.self_attn.k_norm.weight");
  if (GetParam() == "qwen2_moe" || GetParam() == "qwen3_moe") {
    names.push_back("model.layers.1.mlp.gate.weight");
    names.push_back("model.layers.1.mlp.experts.3.up_proj.weight");
    names.push_back("model.layers.0.mlp.experts.0.down_proj.weight");
  }
  if (GetParam() == "qwen2_moe") {
    names.push_back("model.layers.0.mlp.shared_expert.gate_proj.weight");
    names.push_back("model.layers.1.mlp.shared_expert.down_proj.weight");
    names.push_back("model.layers.1.mlp.shared_expert_gate.weight");
  }
  for (const auto& name : names) {
    EXPECT_TRUE(torch::equal(from_gguf.weights(name), from_folder.weights(name))) << name;
  }
  expect_scores_and_generates_as(ref, gguf, dir.file("gen.json"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, QwenGgufParity,
                         ::testing::Values("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"));

// A test folder of `kind` and the GGUF that llama.cpp's converter would write from it (both made
// by hf_folder_reference.py under `python`), with transformers' reference on the folder; the
// GGUF's tokenizer encodes kTexts as transformers does.
struct GgufCase {
  std::string folder, gguf;
  nlohmann::json ref;
};

void make_gguf_case(const TempDir& dir, const std::string& kind, const std::string& python,
                    GgufCase* c) {
  ASSERT_TRUE(std::filesystem::exists(python)) << python;
  c->folder = dir.file("folder");
  c->gguf = dir.file(kind + ".gguf");
  const auto made = run_command(python + " " + DS_HF_FOLDER_REFERENCE_PY + " " + kScoreFile +
                                " '" + c->folder + "' " + kind + " '" + c->gguf + "' 2>&1");
  ASSERT_EQ(made.exit_code, 0) << made.out;
  c->ref = run_reference(c->folder, dir.file("ref.json"), python);
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(c->gguf));
  for (size_t i = 0; i < kTexts.size(); ++i) {
    EXPECT_EQ(tok.encode(kTexts[i]), c->ref["tokens"][i].get<std::vector<int64_t>>())
        << kTexts[i];
  }
}

// The Phi-3 and Phi-4-mini of LlamaFolderParity as llama.cpp's converter writes their GGUFs
// (q/k/v and gate/up fused as attn_qkv and ffn_up, longrope's factors as tensors, the original
// context as metadata, Phi-4-mini's rotated features as rope.dimension_count; Phi-3's
// SentencePiece vocabulary with scores and no merges, Phi-4-mini's byte-level one with GPT-4o's
// pre-tokenizer). transformers' GGUF loader drops the longrope factors and reads any 'phi3'
// vocabulary as SentencePiece, so the reference is transformers on the folder: the GGUF
// tokenizes, scores (past the original context, on the long factors) and generates (Phi-3's
// crossing it) as that, and loads to the folder's config and weights.
class Phi3GgufParity : public ::testing::TestWithParam<std::string> {};

TEST_P(Phi3GgufParity, ScoresAndGeneratesAsTransformersOnItsFolder) {
  TempDir dir("phi3_gguf");
  GgufCase c;
  ASSERT_NO_FATAL_FAILURE(
      make_gguf_case(dir, GetParam(), GetParam() == "phi4_mini" ? kPython5 : kPython, &c));
  const std::string &folder = c.folder, &gguf = c.gguf;
  const nlohmann::json& ref = c.ref;
  const auto from_gguf = open_llama_checkpoint(gguf);
  const auto from_folder = open_llama_checkpoint(folder);
  EXPECT_EQ(from_gguf.config.model_type, "phi3");
  // The same config but for the f32s of the file: the epsilon and the longrope factors.
  EXPECT_NEAR(from_gguf.config.rms_norm_eps, from_folder.config.rms_norm_eps, 1e-12);
  const auto& gguf_rope = from_gguf.config.rope_scaling;
  const auto& folder_rope = from_folder.config.rope_scaling;
  EXPECT_EQ(gguf_rope.rope_type, "longrope");
  ASSERT_EQ(gguf_rope.long_factor.size(), folder_rope.long_factor.size());
  for (size_t i = 0; i < gguf_rope.long_factor.size(); ++i) {
    EXPECT_EQ(static_cast<float>(gguf_rope.long_factor[i]),
              static_cast<float>(folder_rope.long_factor[i]));
    EXPECT_EQ(static_cast<float>(gguf_rope.short_factor[i]),
              static_cast<float>(folder_rope.short_factor[i]));
  }
  auto gguf_config = from_gguf.config.to_hf_json(), folder_config = from_folder.config.to_hf_json();
  for (const char* key : {"rms_norm_eps", "rope_scaling"}) {
    gguf_config.erase(key);
    folder_config.erase(key);
  }
  EXPECT_EQ(gguf_config, folder_config);
  for (const char* name : {"model.layers.1.self_attn.q_proj.weight",
                           "model.layers.1.self_attn.v_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight",
                           "model.layers.0.mlp.up_proj.weight", "lm_head.weight"}) {
    EXPECT_TRUE(torch::equal(from_gguf.weights(name), from_folder.weights(name))) << name;
  }
  expect_scores_and_generates_as(ref, gguf, dir.file("gen.json"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, Phi3GgufParity, ::testing::Values("phi3", "phi4_mini"));

// The DeepSeek-V2 and V3 of LlamaFolderParity (mscale set to mscale_all_dim, as DeepSeek's own
// configs and a GGUF file have it) as llama.cpp's converter writes them: architecture deepseek2,
// one key/value head of the latent's width, kv_b_proj split into attn_k_b and attn_v_b, stacked
// experts, the router's scoring and group limits, exp_probs_b, yarn as factor, betas and
// yarn_log_multiplier; the SentencePiece vocabulary. transformers reads no DeepSeek GGUF, so the
// reference is transformers on the folder: the GGUF tokenizes, scores and generates as that and
// loads to its config (yarn's mscale within f32's rounding) and weights.
class DeepSeekGgufParity : public ::testing::TestWithParam<std::string> {};

TEST_P(DeepSeekGgufParity, ScoresAndGeneratesAsTransformersOnItsFolder) {
  TempDir dir("deepseek_gguf");
  GgufCase c;
  ASSERT_NO_FATAL_FAILURE(make_gguf_case(dir, GetParam(), kPython5, &c));
  const std::string &folder = c.folder, &gguf = c.gguf;
  const nlohmann::json& ref = c.ref;
  const auto from_gguf = open_llama_checkpoint(gguf);
  const auto from_folder = open_llama_checkpoint(folder);
  EXPECT_EQ(from_gguf.config.model_type, GetParam());
  EXPECT_NEAR(from_gguf.config.rms_norm_eps, from_folder.config.rms_norm_eps, 1e-12);
  const auto& gguf_rope = from_gguf.config.rope_scaling;
  const auto& folder_rope = from_folder.config.rope_scaling;
  EXPECT_EQ(gguf_rope.rope_type, "yarn");
  EXPECT_NEAR(gguf_rope.mscale.value_or(0), folder_rope.mscale.value_or(1), 1e-6);
  EXPECT_NEAR(gguf_rope.mscale_all_dim.value_or(0), folder_rope.mscale_all_dim.value_or(1), 1e-6);
  auto gguf_config = from_gguf.config.to_hf_json(), folder_config = from_folder.config.to_hf_json();
  for (auto* c : {&gguf_config, &folder_config}) {
    c->erase("rms_norm_eps");
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      if (c->contains(key) && (*c)[key].is_object()) {
        (*c)[key].erase("mscale");
        (*c)[key].erase("mscale_all_dim");
      }
    }
  }
  EXPECT_EQ(gguf_config, folder_config);
  LlamaForCausalLM a(from_gguf.config, from_gguf.weights);
  LlamaForCausalLM b(from_folder.config, from_folder.weights);
  const auto bp = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), bp[item.key()])) << item.key();
  }
  const auto bb = b->named_buffers();
  for (const auto& item : a->named_buffers()) {
    if (item.key().find("e_score_correction_bias") == std::string::npos) continue;
    EXPECT_TRUE(torch::equal(item.value(), bb[item.key()])) << item.key();
  }
  expect_scores_and_generates_as(ref, gguf, dir.file("gen.json"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, DeepSeekGgufParity,
                         ::testing::Values("deepseek_v2", "deepseek_v3"));

// The Gemma, Gemma 2 and Gemma 3 of LlamaFolderParity as llama.cpp's converter writes their
// GGUFs (every RMSNorm weight plus one, no lm_head, Gemma 2's caps and window, Gemma 3's window
// and global rotation as metadata; the SentencePiece vocabulary with no space prefix), shaped as
// llama.cpp runs such files (Gemma 2 and 3 scaling the scores by the head size; Gemma 3 with six
// layers, the last global, the others rotating with base 10000). transformers' GGUF loader
// reads none of the caps or of Gemma 3's rotation, so the reference is transformers on the
// folder: the GGUF tokenizes, scores and generates as that, and loads to the folder's config and
// weights (the norms within fp32's rounding of the offset).
class GemmaGgufParity : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmaGgufParity, ScoresAndGeneratesAsTransformersOnItsFolder) {
  TempDir dir("gemma_gguf");
  GgufCase c;
  ASSERT_NO_FATAL_FAILURE(
      make_gguf_case(dir, GetParam(), GetParam() == "gemma" ? kPython : kPython5, &c));
  const std::string &folder = c.folder, &gguf = c.gguf;
  const nlohmann::json& ref = c.ref;
  const auto from_gguf = open_llama_checkpoint(gguf);
  const auto from_folder = open_llama_checkpoint(folder);
  EXPECT_NEAR(from_gguf.config.rms_norm_eps, from_folder.config.rms_norm_eps, 1e-12);
  auto gguf_config = from_gguf.config.to_hf_json(), folder_config = from_folder.config.to_hf_json();
  gguf_config.erase("rms_norm_eps");
  folder_config.erase("rms_norm_eps");
  EXPECT_EQ(gguf_config, folder_config);
  LlamaForCausalLM a(from_gguf.config, from_gguf.weights);
  LlamaForCausalLM b(from_folder.config, from_folder.weights);
  const auto bp = b->named_parameters();
  for (const auto& item : a->named_parameters()) {
    const bool norm = item.key().find("norm.weight") != std::string::npos;
    EXPECT_TRUE(norm ? torch::allclose(item.value(), bp[item.key()], 0, 2e-7)
                     : torch::equal(item.value(), bp[item.key()]))
        << item.key();
  }
  expect_scores_and_generates_as(ref, gguf, dir.file("gen.json"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, GemmaGgufParity, ::testing::Values("gemma", "gemma2", "gemma3"));

}  // namespace
}  // namespace deepspeed::examples

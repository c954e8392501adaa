// finetune_llama's rope_scaling against transformers: for linear, llama3, yarn (its defaults and
// its tuned keys), dynamic and longrope (on a Phi3ForCausalLM: the long factors past its original
// context of 128, the short ones within), rope_scaling_reference.py builds a small random model,
// saves it as a Hugging Face folder and writes its rotary frequencies and the logits of 300
// tokens, then of the first 100. We load the folder: the frequencies must be the same floats and
// the logits of both forwards equal to 2e-5 of their scale (dynamic's context is 256: the first
// forward stretches its frequencies, the second puts them back, as transformers does). Yarn's
// later keys against transformers 5.15.1 (RopeScalingParity5). The Python environments come from
// the CTest fixtures llama_python_refs and deepspeed_peer_torch2.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "llama_weights.h"
#include "rope_scaling.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kPython = std::string(DS_SOURCE_DIR) + "/.venv/bin/python";
// transformers 5.15.1: yarn's later keys (original_max_position_embeddings, mscale, truncate).
const std::string kPython5 = std::string(DS_SOURCE_DIR) + "/.venv-deepspeed-torch2/bin/python";

torch::Tensor read_floats(const std::string& path, std::vector<int64_t> shape) {
  std::ifstream in(path, std::ios::binary);
  auto t = torch::empty(shape, torch::kFloat);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * 4);
  EXPECT_TRUE(in.good()) << path;
  return t;
}

// The reference's cases, written once per suite by `python` (with `args`).
TempDir* write_reference(const std::string& python, const std::string& args) {
  EXPECT_TRUE(std::filesystem::exists(python))
      << python << " (run scripts/setup_python_refs.sh, scripts/setup_deepspeed_peer.sh --torch2)";
  auto* dir = new TempDir("rope_scaling_parity");
  const auto r = run_command("OMP_NUM_THREADS=2 DS_ACCELERATOR=cpu " + python + " " +
                             DS_ROPE_SCALING_REFERENCE_PY + " '" + dir->path() + "' " + args +
                             " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  return dir;
}

void expect_parity(const std::string& folder, const std::string& name);

class RopeScalingParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() { dir_ = write_reference(kPython, ""); }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* RopeScalingParity::dir_ = nullptr;

TEST_P(RopeScalingParity, FrequenciesAndLogitsEqualTransformers) {
  expect_parity(dir_->file(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Types, RopeScalingParity,
                         ::testing::Values("linear", "llama3", "yarn", "yarn_tuned", "dynamic",
                                           "longrope"));

// Yarn as transformers 5 reads it: the correction range over original_max_position_embeddings
// (Qwen3's long-context recipe), DeepSeek's mscale / mscale_all_dim, gpt-oss' truncate false.
class RopeScalingParity5 : public RopeScalingParity {
 protected:
  static void SetUpTestSuite() { dir_ = write_reference(kPython5, "--transformers5"); }
};

TEST_P(RopeScalingParity5, FrequenciesAndLogitsEqualTransformers5) {
  expect_parity(dir_->file(GetParam()), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Types, RopeScalingParity5,
                         ::testing::Values("yarn_original", "yarn_mscale"));

void expect_parity(const std::string& folder, const std::string& name) {
  std::ifstream meta_in(folder + "/meta.json");
  const auto meta = nlohmann::json::parse(meta_in);
  const auto ck = open_llama_checkpoint(folder);
  const auto& c = ck.config;
  EXPECT_EQ(c.rope_scaling.rope_type, name.substr(0, name.find('_')));

  const auto rope = rope_frequencies(c.rope_scaling, c.rope_theta, c.head_dim,
                                     c.max_position_embeddings);
  const auto want_freq = read_floats(folder + "/inv_freq.bin", {c.head_dim / 2});
  EXPECT_TRUE(torch::equal(rope.inv_freq, want_freq)) << rope.inv_freq << want_freq;
  EXPECT_DOUBLE_EQ(rope.attention_scaling, meta["attention_scaling"].get<double>());

  torch::NoGradGuard no_grad;
  LlamaForCausalLM model(c, ck.weights);
  model->eval();
  const auto ids = torch::tensor(meta["ids"].get<std::vector<int64_t>>()).unsqueeze(0);
  const auto got = model->logits(ids)[0];
  const auto want = read_floats(folder + "/logits.bin", meta["shape"].get<std::vector<int64_t>>());
  const double scale = want.abs().max().item<double>();
  EXPECT_LE((got - want).abs().max().item<double>(), 2e-5 * scale);
  const auto short_ids = ids.narrow(1, 0, meta["short_shape"][0].get<int64_t>());
  const auto want_short = read_floats(folder + "/logits_short.bin",
                                      meta["short_shape"].get<std::vector<int64_t>>());
  EXPECT_LE((model->logits(short_ids)[0] - want_short).abs().max().item<double>(), 2e-5 * scale);

  // The default rotary embedding gives other logits: the scaling is what made them equal.
  LlamaConfig plain = c;
  plain.rope_scaling = RopeScaling{};
  plain.max_position_embeddings = std::max(plain.max_position_embeddings, ids.size(1));
  LlamaForCausalLM unscaled(plain, ck.weights);
  EXPECT_GT((unscaled->logits(ids)[0] - want).abs().max().item<double>(), 1e-3 * scale);

  // config.json as save_hf writes it reads back to the same scaling.
  const auto again = RopeScaling::from_hf_json(c.to_hf_json()["rope_scaling"], "again");
  EXPECT_TRUE(torch::equal(
      rope_frequencies(again, c.rope_theta, c.head_dim, c.max_position_embeddings).inv_freq,
      rope.inv_freq));
}

}  // namespace
}  // namespace deepspeed::examples

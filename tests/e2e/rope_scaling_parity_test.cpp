// finetune_llama's rope_scaling against transformers: for linear, llama3, yarn (its defaults and
// its tuned keys), dynamic and longrope (on a Phi3ForCausalLM: the long factors past its original
// context of 128, the short ones within), rope_scaling_reference.py builds a small random model,
// saves it as a Hugging Face folder and writes its rotary frequencies and the logits of 300
// tokens, then of the first 100. We load the folder: the frequencies must be the same floats and
// the logits of both forwards equal to 2e-5 of their scale (dynamic's context is 256: the first
// forward stretches its frequencies, the second puts them back, as transformers does).
// The Python environment comes from the CTest fixture llama_python_refs.
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

torch::Tensor read_floats(const std::string& path, std::vector<int64_t> shape) {
  std::ifstream in(path, std::ios::binary);
  auto t = torch::empty(shape, torch::kFloat);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * 4);
  EXPECT_TRUE(in.good()) << path;
  return t;
}

class RopeScalingParity : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " (run scripts/setup_python_refs.sh)";
    dir_ = new TempDir("rope_scaling_parity");
    const auto r = run_command("OMP_NUM_THREADS=2 " + kPython + " " + DS_ROPE_SCALING_REFERENCE_PY +
                               " '" + dir_->path() + "' 2>&1");
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  static void TearDownTestSuite() { delete dir_; }
  static TempDir* dir_;
};
TempDir* RopeScalingParity::dir_ = nullptr;

TEST_P(RopeScalingParity, FrequenciesAndLogitsEqualTransformers) {
  const std::string folder = dir_->file(GetParam());
  std::ifstream meta_in(folder + "/meta.json");
  const auto meta = nlohmann::json::parse(meta_in);
  const auto ck = open_llama_checkpoint(folder);
  const auto& c = ck.config;
  EXPECT_EQ(c.rope_scaling.rope_type, GetParam().substr(0, GetParam().find('_')));

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

INSTANTIATE_TEST_SUITE_P(Types, RopeScalingParity,
                         ::testing::Values("linear", "llama3", "yarn", "yarn_tuned", "dynamic",
                                           "longrope"));

}  // namespace
}  // namespace deepspeed::examples

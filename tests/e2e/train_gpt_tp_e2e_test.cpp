// train_gpt --tensor_parallel_size under the deepspeed launcher: TP=2 on 2 ranks trains with the
// same loss at every step and the same held-out loss as one process (AutoTP is exact in fp32), 3D (TP=2 x PP=2) on 4 ranks
// trains, and a head count that does not divide is an error naming the sizes.
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

struct GptRun {
  int exit_code;
  std::string output;
  std::vector<nlohmann::json> rows;
};

GptRun train_gpt(testing::TempDir& dir, int ranks, const std::string& flags, const std::string& name,
                 const std::string& model = "--n_head 2 --n_embd 32") {
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus " +
      std::to_string(ranks) + " --master_port " + std::to_string(testing::reserve_port()) +
      " " + DS_TRAIN_GPT_BIN + " --deepspeed_config " + dir.file("ds_config.json") + " --data " +
      dir.file("corpus.txt") +
      " --steps 4 --n_layer 2 --seq_len 32 --eval_batches 1 --compact_vocab --metrics_file " +
      dir.file(name + ".jsonl") + " " + model + " " + flags;
  auto r = testing::run_command(cmd);
  GptRun out{r.exit_code, r.out + r.err, {}};
  std::ifstream in(dir.file(name + ".jsonl"));
  for (std::string line; std::getline(in, line);) out.rows.push_back(nlohmann::json::parse(line));
  return out;
}

// The "held-out loss A -> B" of train_gpt's last line (printed with 4 decimals).
std::string held_out(const std::string& output) {
  const std::string key = "| held-out loss ";
  const size_t at = output.rfind(key);
  if (at == std::string::npos) return "(none)";
  return output.substr(at + key.size(), output.find('\n', at) - at - key.size());
}

TEST(TrainGptTensorParallelE2E, Tp2MatchesOneProcessAnd3dTrains) {
  testing::TempDir dir;
  testing::write_text_file(dir.file("ds_config.json"), R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 1, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();

  GptRun one = train_gpt(dir, 1, "", "one");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  GptRun tp = train_gpt(dir, 2, "--tensor_parallel_size 2", "tp");
  ASSERT_EQ(tp.exit_code, 0) << tp.output;
  EXPECT_NE(tp.output.find("AutoTP over"), std::string::npos) << tp.output;
  ASSERT_EQ(tp.rows.size(), 4u) << tp.output;
  ASSERT_EQ(one.rows.size(), 4u) << one.output;
  for (size_t i = 0; i < 4; ++i) {
    const double want = one.rows[i]["loss"].get<double>();
    EXPECT_NEAR(tp.rows[i]["loss"].get<double>(), want, 1e-4 * want) << "step " << i + 1;
  }
  // The held-out loss too: the tensor-parallel peers evaluate the same windows.
  EXPECT_EQ(held_out(tp.output), held_out(one.output)) << tp.output;

  GptRun three_d = train_gpt(dir, 4, "--tensor_parallel_size 2 --pipeline_parallel_size 2", "3d");
  ASSERT_EQ(three_d.exit_code, 0) << three_d.output;
  ASSERT_EQ(three_d.rows.size(), 4u) << three_d.output;
  EXPECT_LT(three_d.rows.back()["loss"].get<double>(), three_d.rows.front()["loss"].get<double>());

  GptRun bad = train_gpt(dir, 2, "--tensor_parallel_size 2", "bad", "--n_head 3 --n_embd 30");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("n_head (3) is not divisible by 2"), std::string::npos) << bad.output;
}

}  // namespace
}  // namespace deepspeed

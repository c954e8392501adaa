// train_gpt with sequence_parallel_size under the deepspeed launcher: each window's tokens split
// over 2 ranks (DeepSpeed-Ulysses attention) train with the loss of one process on whole windows
// at every step, under ZeRO 0 and 3; 2 replicas of 2 sequence ranks (4 ranks) train as 2
// data-parallel ranks; a head count the sequence group does not divide is an error naming it.
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

GptRun train_gpt(testing::TempDir& dir, int ranks, const std::string& config,
                 const std::string& name, const std::string& model = "--n_head 2 --n_embd 32") {
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus " +
      std::to_string(ranks) + " --master_port " + std::to_string(testing::reserve_port()) +
      " " + DS_TRAIN_GPT_BIN + " --deepspeed_config " + dir.file(config) + " --data " +
      dir.file("corpus.txt") +
      " --steps 4 --n_layer 2 --seq_len 32 --eval_batches 1 --compact_vocab --metrics_file " +
      dir.file(name + ".jsonl") + " " + model;
  auto r = testing::run_command(cmd);
  GptRun out{r.exit_code, r.out + r.err, {}};
  std::ifstream in(dir.file(name + ".jsonl"));
  for (std::string line; std::getline(in, line);) out.rows.push_back(nlohmann::json::parse(line));
  return out;
}

// SGD without clipping: a gradient off by the sequence-parallel factor shows in the losses
// (Adam's update would not see it).
void write_config(testing::TempDir& dir, const std::string& name, int sp, int stage) {
  testing::write_text_file(dir.file(name), R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 1, "gradient_clipping": 0, "sequence_parallel_size": )" +
                                               std::to_string(sp) + R"(,
      "zero_optimization": {"stage": )" + std::to_string(stage) + R"(},
      "zero_allow_untested_optimizer": true,
      "optimizer": {"type": "SGD", "params": {"lr": 0.5, "momentum": 0.9}}})");
}

// The final held-out loss of train_gpt's last line ("held-out loss A -> B").
double final_held_out(const std::string& output) {
  const size_t line = output.rfind("| held-out loss ");
  const size_t at = line == std::string::npos ? line : output.find("-> ", line);
  return at == std::string::npos ? -1.0 : std::stod(output.substr(at + 3));
}

void expect_same_losses(const GptRun& got, const GptRun& want) {
  ASSERT_EQ(got.exit_code, 0) << got.output;
  ASSERT_EQ(want.exit_code, 0) << want.output;
  ASSERT_EQ(got.rows.size(), 4u) << got.output;
  ASSERT_EQ(want.rows.size(), 4u) << want.output;
  for (size_t i = 0; i < 4; ++i) {
    const double w = want.rows[i]["loss"].get<double>();
    EXPECT_NEAR(got.rows[i]["loss"].get<double>(), w, 1e-4 * w) << "step " << i + 1;
  }
  // The held-out evaluation splits its windows the same way.
  EXPECT_NEAR(final_held_out(got.output), final_held_out(want.output), 2e-4) << got.output;
}

TEST(TrainGptSequenceParallelE2E, TwoSequenceRanksTrainAsOneProcess) {
  testing::TempDir dir;
  write_config(dir, "plain.json", 1, 0);
  write_config(dir, "sp.json", 2, 0);
  write_config(dir, "sp_zero3.json", 2, 3);
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();

  const GptRun one = train_gpt(dir, 1, "plain.json", "one");
  const GptRun sp = train_gpt(dir, 2, "sp.json", "sp");
  expect_same_losses(sp, one);
  // The ranks of a sequence group read the same windows: 1 data-parallel replica.
  EXPECT_NE(sp.output.find("1 data-parallel"), std::string::npos) << sp.output;
  expect_same_losses(train_gpt(dir, 2, "sp_zero3.json", "sp_zero3"), one);
  // --lm_loss chunked/fused: each rank's tokens' losses in that form, gathered over the group.
  for (const std::string form : {"chunked", "fused"}) {
    expect_same_losses(
        train_gpt(dir, 2, "sp.json", "sp_" + form, "--n_head 2 --n_embd 32 --lm_loss " + form),
        one);
  }

  // 2 replicas x 2 sequence ranks read and train as 2 data-parallel ranks.
  expect_same_losses(train_gpt(dir, 4, "sp.json", "sp_dp"), train_gpt(dir, 2, "plain.json", "dp"));

  const GptRun bad = train_gpt(dir, 2, "sp.json", "bad", "--n_head 3 --n_embd 30");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("not divisible by the sequence-parallel size 2"), std::string::npos)
      << bad.output;
}

}  // namespace
}  // namespace deepspeed

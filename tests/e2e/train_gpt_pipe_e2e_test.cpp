// train_gpt --pipeline_parallel_size 2 under the deepspeed launcher on 2 ranks: the GPT trains as
// a 2-stage pipeline (loss goes down), the progress line and the metrics file keep their form,
// wall_clock_breakdown prints each stage's timeline, and the stages are cut as
// --pipe_partition_method says (by blocks by default).
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

TEST(TrainGptPipeE2E, TwoStagesTrainAndKeepTheProgressLineAndMetrics) {
  testing::TempDir dir;
  testing::write_text_file(dir.file("ds_config.json"), R"({
      "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 1, "wall_clock_breakdown": true, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus 2 --master_port " +
      std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
      " --deepspeed_config " + dir.file("ds_config.json") + " --data " + dir.file("corpus.txt") +
      " --steps 6 --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --eval_batches 2 "
      "--compact_vocab --pipeline_parallel_size 2 --metrics_file " + dir.file("metrics.jsonl");
  auto r = testing::run_command(cmd);
  const std::string all = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << all;
  // 1 data-parallel replica x 2 sequences x 2 micro-batches per step.
  EXPECT_NE(all.find("2 ranks, 1 data-parallel x micro-batch 2 x accumulation 2 = 4 sequences"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("step 6 | loss "), std::string::npos) << all;
  EXPECT_NE(all.find("train_gpt: done: 6 steps"), std::string::npos) << all;
  // Cut by blocks (the default): one with the embedding, one with the final norm and the head.
  EXPECT_NE(all.find("Partitioning pipeline stages with method type:Block"), std::string::npos)
      << all;
  EXPECT_NE(all.find("stage=0 layers=2\n"), std::string::npos) << all;
  EXPECT_NE(all.find("stage=1 layers=3\n"), std::string::npos) << all;
  EXPECT_NE(all.find("[pipe stage 0/2] batch"), std::string::npos) << all;
  EXPECT_NE(all.find("[pipe stage 1/2] batch"), std::string::npos) << all;
  std::ifstream in(dir.file("metrics.jsonl"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 6u) << all;
  for (const char* key : {"step", "loss", "lr", "samples", "tokens_per_s", "grad_norm",
                          "memory_bytes"}) {
    EXPECT_TRUE(rows.back().contains(key)) << key;
  }
  EXPECT_EQ(rows.back()["samples"].get<int64_t>(), 6 * 4);
  EXPECT_EQ(rows.back()["memory_bytes"]["rss"].size(), 2u);
  EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>()) << all;
}

// "uniform" cuts the five layers 3 + 2, where the default cuts them 2 + 3.
TEST(TrainGptPipeE2E, PartitionMethodFlagReachesThePipeline) {
  testing::TempDir dir;
  testing::write_text_file(dir.file("ds_config.json"), R"({
      "train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "AdamW"}})");
  std::ifstream src(DS_FIXTURE_TEXT);  // train_gpt caches the tokens beside the corpus
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus 2 --master_port " +
      std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
      " --deepspeed_config " + dir.file("ds_config.json") + " --data " + dir.file("corpus.txt") +
      " --steps 1 --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --eval_batches 1 "
      "--compact_vocab --pipeline_parallel_size 2 --pipe_partition_method uniform";
  auto r = testing::run_command(cmd);
  const std::string all = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << all;
  EXPECT_NE(all.find("Partitioning pipeline stages with method uniform"), std::string::npos)
      << all;
  EXPECT_NE(all.find("stage=0 layers=3\n"), std::string::npos) << all;
}

TEST(TrainGptPipeE2E, PartitionMethodWithoutAPipelineIsRefused) {
  auto r = testing::run_command(std::string(DS_TRAIN_GPT_BIN) + " --pipe_partition_method uniform");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--pipe_partition_method needs --pipeline_parallel_size > 1"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace deepspeed

// train_gpt --activation_checkpointing under the deepspeed launcher on 2 ranks, dropout on: the
// same losses and gradient norms, step for step, as the same run without it: ZeRO-0, ZeRO-2 with
// overlap_comm and small buckets (gradient hooks fire inside the recomputation's backward), and
// ZeRO-3 (whose blocks are gathered again for the recomputation).
#include <unistd.h>

#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using testing::run_command;

constexpr int kSteps = 3;

std::vector<nlohmann::json> train(const testing::TempDir& dir, int stage, bool checkpointed,
                                  std::string* out) {
  const std::string name = "s" + std::to_string(stage) + (checkpointed ? "_ckpt" : "");
  testing::write_text_file(dir.file(name + ".json"),
                           R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 100, "zero_optimization": {"stage": )" +
                               std::to_string(stage) +
                               (stage == 2 ? R"(, "overlap_comm": true, "reduce_bucket_size": 5000)"
                                           : "") +
                               R"(},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  const std::string cmd =
      std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus 2 --master_port " +
      std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
      " --deepspeed_config " + dir.file(name + ".json") + " --data " + DS_FIXTURE_TEXT +
      " --steps " + std::to_string(kSteps) +
      " --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --eval_batches 1 --dropout 0.1"
      " --metrics_file " + dir.file(name + ".jsonl") +
      (checkpointed ? " --activation_checkpointing" : "");
  auto r = run_command(cmd);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  *out = r.out + r.err;
  std::ifstream in(dir.file(name + ".jsonl"));
  std::vector<nlohmann::json> rows;
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

TEST(ActivationCheckpointingE2E, SameLossesWithDropoutOnForZero0To3) {
  testing::TempDir dir;
  for (int stage : {0, 2, 3}) {
    std::string plain_out, ckpt_out;
    const auto plain = train(dir, stage, false, &plain_out);
    const auto ckpt = train(dir, stage, true, &ckpt_out);
    EXPECT_EQ(plain_out.find("activation checkpointing:"), std::string::npos) << plain_out;
    EXPECT_NE(ckpt_out.find("activation checkpointing: partition_activations false"),
              std::string::npos)
        << ckpt_out;
    ASSERT_EQ(plain.size(), static_cast<size_t>(kSteps)) << plain_out;
    ASSERT_EQ(ckpt.size(), static_cast<size_t>(kSteps)) << ckpt_out;
    for (int i = 0; i < kSteps; ++i) {
      EXPECT_EQ(plain[i]["loss"].get<double>(), ckpt[i]["loss"].get<double>())
          << "stage " << stage << ", step " << i + 1;
      EXPECT_EQ(plain[i]["grad_norm"].get<double>(), ckpt[i]["grad_norm"].get<double>())
          << "stage " << stage << ", step " << i + 1;
    }
  }
}

}  // namespace
}  // namespace deepspeed

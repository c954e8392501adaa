// The ds_config tool as a user runs it: resolved JSON, the LR schedule CSV, and errors.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using testing::run_command;

TEST(DsConfigTool, PrintsResolvedConfigWithTriadFilledIn) {
  auto r = run_command(std::string(DS_CONFIG_BIN) + " " + DS_TRAIN_CONFIG + " --world-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train_micro_batch_size_per_gpu"], 8);
  EXPECT_EQ(j["train_batch_size"], 32);
  EXPECT_EQ(j["data_parallel_world_size"], 4);
  EXPECT_EQ(j["zero_optimization"]["stage"], 0);
  EXPECT_EQ(j["fp16"]["loss_scale_window"], 1000);
}

TEST(DsConfigTool, PrintsLrScheduleCsv) {
  testing::TempDir dir;
  std::string cfg = dir.file("c.json");
  testing::write_text_file(cfg, R"({"train_batch_size": 4,
      "optimizer": {"type": "Adam", "params": {"lr": 0.5}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.2,
                    "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  auto r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg + " --lr-schedule 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "step,lr\n0,0.1\n1,0.1\n2,0.11\n3,0.12\n");
}

TEST(DsConfigTool, InvalidConfigExitsNonZeroWithErrorOnStderr) {
  testing::TempDir dir;
  std::string cfg = dir.file("bad.json");
  testing::write_text_file(cfg, R"({"train_batch_size": 8, "zero_optimization": {"stgae": 2}})");
  auto r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.out.empty());
  EXPECT_NE(r.err.find("zero_optimization.stgae is not a known key; did you mean 'stage'?"),
            std::string::npos) << r.err;

  testing::write_text_file(cfg, R"({"train_batch_size": 8,
      "zero_optimization": {"stage": 3, "zenflow": {}}})");
  r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("zero_optimization.zenflow (ZenFlow) is not supported yet"),
            std::string::npos) << r.err;

  testing::write_text_file(cfg, R"({"train_batch_size": 9, "train_micro_batch_size_per_gpu": 2})");
  r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg + " --world-size 2");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("train_batch_size (9) != train_micro_batch_size_per_gpu (2) * "
                       "gradient_accumulation_steps (2) * data-parallel size (2) = 8"),
            std::string::npos) << r.err;
}

TEST(DsConfigTool, UnknownTopLevelKeyWarnsButValidates) {
  testing::TempDir dir;
  std::string cfg = dir.file("warn.json");
  testing::write_text_file(cfg, R"({"train_batch_size": 8, "steps_per_prnt": 10})");
  auto r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("warn.json: steps_per_prnt is not a known key"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did you mean 'steps_per_print'?"), std::string::npos) << r.err;
}

TEST(DsConfigTool, FormerCrashersExitWithOneAndNameTheKey) {
  // Each of these aborted ds_config (exit 134, uncaught nlohmann::json type_error 302).
  testing::TempDir dir;
  std::string cfg = dir.file("c.json");
  for (auto [text, message] : {
           std::pair{R"({"train_batch_size": 8, "tensor_parallel": {"autotp_size": "auto"}})",
                     "tensor_parallel.autotp_size is \"auto\""},
           std::pair{R"({"train_batch_size": 8, "compile": {"deepcompile": "true"}})",
                     "compile.deepcompile is \"true\"; expected true or false"},
           std::pair{R"({"train_batch_size": 8, "graph_harvesting": {"enabled": true}})",
                     "graph_harvesting is {\"enabled\":true}; expected true or false"}}) {
    testing::write_text_file(cfg, text);
    auto r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg);
    EXPECT_EQ(r.exit_code, 1) << text << "\n" << r.err;
    EXPECT_NE(r.err.find(std::string("ds_config: error: ") + cfg + ": " + message),
              std::string::npos) << r.err;
  }
}

TEST(DsConfigTool, AutoValuesAreResolvedWithANoteOrRefused) {
  testing::TempDir dir;
  std::string cfg = dir.file("hf.json");
  testing::write_text_file(cfg, R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4,
      "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  auto r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg + " --world-size 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("note: " + cfg + ": train_batch_size: \"auto\" resolved to 32 = micro 4 "
                       "x accum 2 x world 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("zero_optimization.reduce_bucket_size: \"auto\" is set at initialize from "
                       "the model's hidden size"), std::string::npos) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["train_batch_size"], 32);
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"],
            "hidden_size^2 (set from the model at initialize)");
  EXPECT_EQ(j["zero_optimization"].dump().find("auto"), std::string::npos) << r.out;

  r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg + " --world-size 4 --hidden-size 1024");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["zero_optimization"]["reduce_bucket_size"], 1024 * 1024);
  EXPECT_EQ(j["zero_optimization"]["stage3_param_persistence_threshold"], 10240);
  EXPECT_NE(r.err.find("reduce_bucket_size: \"auto\" resolved to 1048576 = hidden_size^2 with "
                       "hidden_size 1024 (--hidden-size)"), std::string::npos) << r.err;

  testing::write_text_file(cfg, R"({"train_batch_size": 8,
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})");
  r = run_command(std::string(DS_CONFIG_BIN) + " " + cfg);
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("optimizer.params.lr is \"auto\"; \"auto\" is a placeholder that the "
                       "Hugging Face integration fills in"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deepspeed

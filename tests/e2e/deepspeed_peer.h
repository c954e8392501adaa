// What the checkpoint tests against Python DeepSpeed share: train_gpt and the DeepSpeed peer
// (bench/common/deepspeed_train_gpt.py: the same GPT, the same token windows) on 2 ranks over a
// copy of the corpus, each with a ds_config the test writes, and the metrics files both write.
// The including test defines DS_DEEPSPEED_PYTHON (which DeepSpeed venv), DS_PEER_SCRIPT,
// DS_LAUNCHER_BIN, DS_TRAIN_GPT_BIN and DS_FIXTURE_TEXT.
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed::interop {

inline constexpr const char* kModel =
    " --n_layer 2 --n_head 2 --n_embd 32 --seq_len 32 --compact_vocab --val_fraction 0.2";

inline std::string port() { return std::to_string(testing::reserve_port()); }

/// One step of a metrics file (train_gpt's or the peer's: the same keys). grad_norm is NaN where
/// the writer had none.
struct StepRow {
  double loss = 0.0;
  double grad_norm = std::numeric_limits<double>::quiet_NaN();
};

inline std::map<int, StepRow> rows(const std::string& path) {
  std::map<int, StepRow> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    StepRow r;
    r.loss = row["loss"].get<double>();
    if (row.contains("grad_norm") && row["grad_norm"].is_number()) {
      r.grad_norm = row["grad_norm"].get<double>();
    }
    out[row["step"].get<int>()] = r;
  }
  return out;
}

/// The rows a run wrote to `metrics`; none when the run failed (its output becomes the failure).
inline std::map<int, StepRow> rows_of(const testing::CommandResult& run,
                                      const std::string& metrics) {
  if (run.exit_code != 0) {
    ADD_FAILURE() << "exit status " << run.exit_code << "\n" << run.out << run.err;
    return {};
  }
  return rows(metrics);
}

/// step -> loss.
inline std::map<int, double> losses_of(const testing::CommandResult& run,
                                       const std::string& metrics) {
  std::map<int, double> out;
  for (const auto& [step, row] : rows_of(run, metrics)) out[step] = row.loss;
  return out;
}

/// `got` against `want` at these steps (both must have run them), printed as "step S: what".
inline void expect_losses_near(const std::map<int, double>& got,
                               const std::map<int, double>& want,
                               std::initializer_list<int> steps, double bound, const char* what) {
  ASSERT_EQ(got.size(), steps.size());
  ASSERT_EQ(want.size(), steps.size());
  for (int step : steps) {
    std::printf("step %d: %s %.7f, expected %.7f\n", step, what, got.at(step), want.at(step));
    EXPECT_NEAR(got.at(step), want.at(step), bound) << what << " at step " << step;
  }
}

/// Runs train_gpt and the DeepSpeed peer on 2 ranks over a copy of the corpus.
class DeepSpeedPeer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(DS_DEEPSPEED_PYTHON)) {
      GTEST_SKIP() << DS_DEEPSPEED_PYTHON << " is missing (scripts/setup_deepspeed_peer.sh)";
    }
    std::ifstream src(DS_FIXTURE_TEXT);  // train_gpt caches the tokens beside the corpus
    std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  }

  /// Writes NAME.json: the shared config at this ZeRO stage, plus `extra` (JSON members).
  std::string config(const std::string& name, int zero_stage, const std::string& extra = "") {
    const std::string path = dir.file(name + ".json");
    testing::write_text_file(path, R"({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "steps_per_print": 1, "gradient_clipping": 1.0,
        "zero_optimization": {"stage": )" + std::to_string(zero_stage) + R"(},
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
                      "warmup_max_lr": 3e-3, "warmup_num_steps": 8, "warmup_type": "linear"}})" +
                                         (extra.empty() ? "" : ", " + extra) + "}");
    return path;
  }

  std::string common_flags(const std::string& config_path, const std::string& flags) const {
    return " --deepspeed_config " + config_path + " --data " + dir.file("corpus.txt") + kModel +
           " " + flags;
  }

  /// `env` prefixes the command (variables for train_gpt).
  testing::CommandResult ours(const std::string& config_path, const std::string& flags,
                              const std::string& env = "") {
    return testing::run_command(env + " OMP_NUM_THREADS=1 " + DS_LAUNCHER_BIN +
                                " --num_gpus 2 --master_port " + port() + " " +
                                DS_TRAIN_GPT_BIN + " --eval_batches 1" +
                                common_flags(config_path, flags));
  }

  testing::CommandResult deepspeed(const std::string& config_path, const std::string& flags) {
    return testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                DS_LAUNCHER_BIN + " --num_gpus 2 --master_port " + port() + " " +
                                DS_DEEPSPEED_PYTHON + " " + DS_PEER_SCRIPT +
                                common_flags(config_path, flags));
  }

  testing::TempDir dir;
};

}  // namespace deepspeed::interop

// ZeRO-3's variants against DeepSpeed 0.15.4's own (.venv-deepspeed; the peer is
// bench/common/deepspeed_train_gpt.py): train_gpt and DeepSpeed on 4 ranks with ZeRO-3 and
// MiCS (mics_shard_size 2: two shard groups of two ranks, replicas of each other; DeepSpeed's
// MiCS_Optimizer) or ZeRO++'s hpZ (zero_hpz_partition_size 2: secondary partitions over pairs
// of ranks).
//  - The same training: the first step's gradient norm (the reduced gradients before any
//    update) and the losses of 4 steps agree.
//  - Checkpoints both ways: DeepSpeed resumes train_gpt's checkpoint of step 2 with the losses
//    of train_gpt's own resume at steps 3 and 4; train_gpt resumes DeepSpeed's of step 4 with
//    the loss at step 5 of its own uninterrupted resume. Under MiCS both write the first shard
//    group's files only (zero_pp_rank_0 and _1). DeepSpeed cannot resume a MiCS checkpoint as
//    released (its engine passes param_shapes= to MiCS_Optimizer.load_state_dict, which does
//    not take it, so its own checkpoints fail too): the peer drops that argument
//    (fit_mics_load).
#include <cstdio>
#include <filesystem>
#include <map>
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "deepspeed_peer.h"

namespace deepspeed {
namespace {

using interop::DeepSpeedPeer;
using interop::expect_losses_near;
using interop::losses_of;

constexpr int kRanks = 4;
constexpr const char* kModel =
    " --n_layer 2 --n_head 4 --n_embd 32 --seq_len 32 --compact_vocab --val_fraction 0.2";
// Measured: the first step's gradient norm and the losses agree to 7 digits. A checkpoint that
// lost the Adam moments, the schedule or the data position moves a loss by 1e-3 or more.
constexpr double kLossBound = 1e-5;

struct Variant {
  const char* name;
  const char* zero;           // the zero_optimization section
  bool first_shard_group_saves;  // MiCS: only ranks 0 and 1 write ZeRO files
};

const Variant kVariants[] = {
    {"Mics", R"({"stage": 3, "mics_shard_size": 2})", true},
    {"Hpz", R"({"stage": 3, "zero_hpz_partition_size": 2})", false},
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class DeepSpeedZero3Variants : public DeepSpeedPeer, public ::testing::WithParamInterface<Variant> {
 protected:
  void SetUp() override {
    DeepSpeedPeer::SetUp();
    if (IsSkipped()) return;
    config_path_ = dir.file("ds_config.json");
    testing::write_text_file(config_path_, std::string(R"({
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
        "steps_per_print": 1, "gradient_clipping": 1.0,
        "zero_optimization": )") + GetParam().zero + R"(,
        "optimizer": {"type": "AdamW",
                      "params": {"lr": 3e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0,
                      "warmup_max_lr": 3e-3, "warmup_num_steps": 8, "warmup_type": "linear"}}})");
  }

  // train_gpt (with DS_CHECKPOINT_PYTHON_OBJECTS=1: DeepSpeed's ZeRO loader calls methods on the
  // pickled loss scaler) or the peer; `flags` adds steps, dirs and metrics.
  testing::CommandResult run(bool ours, const std::string& flags) {
    const std::string program =
        ours ? std::string(DS_TRAIN_GPT_BIN) + " --eval_batches 1"
             : std::string(DS_DEEPSPEED_PYTHON) + " " + DS_PEER_SCRIPT;
    return testing::run_command(
        std::string(ours ? "DS_CHECKPOINT_PYTHON_OBJECTS=1 " : "") +
        "OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu " + DS_LAUNCHER_BIN + " --num_gpus " +
        std::to_string(kRanks) + " --master_port " + interop::port() + " " + program +
        " --deepspeed_config " + config_path_ + " --data " + dir.file("corpus.txt") + kModel +
        " " + flags);
  }

  // Whether rank 2's ZeRO optimizer file is absent exactly when only the first shard group saves.
  void expect_writers(const std::string& tag_dir) {
    const bool third =
        std::filesystem::exists(tag_dir + "/zero_pp_rank_2_mp_rank_00_optim_states.pt");
    EXPECT_TRUE(std::filesystem::exists(tag_dir + "/zero_pp_rank_1_mp_rank_00_optim_states.pt"))
        << tag_dir;
    EXPECT_EQ(third, !GetParam().first_shard_group_saves) << tag_dir;
  }

  std::string config_path_;
};

TEST_P(DeepSpeedZero3Variants, TrainsAsDeepSpeed) {
  const auto ours = run(true, "--steps 4 --metrics_file " + dir.file("ours.jsonl"));
  const auto theirs = run(false, "--steps 4 --metrics_file " + dir.file("ds.jsonl"));
  const auto got = interop::rows_of(ours, dir.file("ours.jsonl"));
  const auto want = interop::rows_of(theirs, dir.file("ds.jsonl"));
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  const double norm = want.at(1).grad_norm;
  std::printf("step 1 gradient norm %.7f, DeepSpeed's %.7f\n", got.at(1).grad_norm, norm);
  EXPECT_NEAR(got.at(1).grad_norm, norm, 1e-5 * norm);
  std::map<int, double> got_losses, want_losses;
  for (const auto& [step, row] : got) got_losses[step] = row.loss;
  for (const auto& [step, row] : want) want_losses[step] = row.loss;
  expect_losses_near(got_losses, want_losses, {1, 2, 3, 4}, kLossBound, "train_gpt");
}

TEST_P(DeepSpeedZero3Variants, EachResumesTheOthersCheckpoint) {
  auto first = run(true, "--steps 2 --save_dir " + dir.file("ours"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  expect_writers(dir.file("ours/global_step2"));
  const auto expected = losses_of(run(true, "--steps 5 --load_dir " + dir.file("ours") +
                                                " --metrics_file " + dir.file("ours.jsonl")),
                                  dir.file("ours.jsonl"));
  ASSERT_EQ(expected.size(), 3u);  // steps 3, 4, 5

  const auto theirs = losses_of(
      run(false, "--steps 4 --load_dir " + dir.file("ours") + " --save_dir " + dir.file("ds") +
                     " --metrics_file " + dir.file("ds.jsonl")),
      dir.file("ds.jsonl"));
  expect_losses_near(theirs, {{3, expected.at(3)}, {4, expected.at(4)}}, {3, 4}, kLossBound,
                     "DeepSpeed from train_gpt's checkpoint");
  expect_writers(dir.file("ds/global_step4"));

  const auto again = losses_of(
      run(true, "--steps 5 --load_dir " + dir.file("ds") + " --metrics_file " +
                    dir.file("back.jsonl")),
      dir.file("back.jsonl"));
  expect_losses_near(again, {{5, expected.at(5)}}, {5}, kLossBound,
                     "train_gpt from DeepSpeed's checkpoint");
}

INSTANTIATE_TEST_SUITE_P(Variants, DeepSpeedZero3Variants, ::testing::ValuesIn(kVariants),
                         [](const ::testing::TestParamInfo<Variant>& info) {
                           return std::string(info.param.name);
                         });

}  // namespace
}  // namespace deepspeed

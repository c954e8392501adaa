// Sequence parallelism against Python DeepSpeed's own (0.15.4 on the same python3-torch,
// .venv-deepspeed; the peer is bench/common/deepspeed_train_gpt.py, whose GPT then attends
// through deepspeed.sequence's DistributedAttention, takes its loss from
// vocab_sequence_parallel_cross_entropy, and gets its groups from a Megatron-style mpu with
// sequence-parallel and sequence-data-parallel groups). The same windows and ds_config with
// "sequence_parallel_size": 2 under ZeRO-1, on 2 ranks and on 4 (2 replicas): the gradient norm
// of the first step (before any update: the reduced gradients themselves, their sum over a
// sequence group and mean over the replicas) and the losses of 4 steps agree with DeepSpeed's.
#include <string>

#include <gtest/gtest.h>

#include "deepspeed_peer.h"

namespace deepspeed {
namespace {

using interop::DeepSpeedPeer;

// DeepSpeed 0.15.4's exchange counts the heads of every tensor it moves, the attention output's
// (n_head / P) included, and takes another path unless each is a multiple of P: 4 heads.
constexpr const char* kSpModel =
    " --n_layer 2 --n_head 4 --n_embd 32 --seq_len 32 --compact_vocab --val_fraction 0.2"
    " --steps 4";

class DeepSpeedUlyssesInterop : public DeepSpeedPeer {
 protected:
  testing::CommandResult run(const std::string& program, int ranks, const std::string& cfg,
                             const std::string& metrics) {
    return testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                DS_LAUNCHER_BIN + " --num_gpus " + std::to_string(ranks) +
                                " --master_port " + interop::port() + " " + program +
                                " --deepspeed_config " + cfg + " --data " +
                                dir.file("corpus.txt") + kSpModel + " --metrics_file " +
                                dir.file(metrics));
  }

  void compare(int ranks) {
    const std::string cfg =
        config("sp" + std::to_string(ranks), 1, R"("sequence_parallel_size": 2)");
    const std::string tag = std::to_string(ranks);
    const auto ours = run(std::string(DS_TRAIN_GPT_BIN) + " --eval_batches 1", ranks, cfg,
                          "ours" + tag + ".jsonl");
    const auto theirs = run(std::string(DS_DEEPSPEED_PYTHON) + " " + DS_PEER_SCRIPT, ranks, cfg,
                            "deepspeed" + tag + ".jsonl");
    const auto got = interop::rows_of(ours, dir.file("ours" + tag + ".jsonl"));
    const auto want = interop::rows_of(theirs, dir.file("deepspeed" + tag + ".jsonl"));
    ASSERT_EQ(got.size(), 4u);
    ASSERT_EQ(want.size(), 4u);
    const double norm = want.at(1).grad_norm;
    std::printf("%d ranks: step 1 gradient norm %.7f, DeepSpeed's %.7f\n", ranks,
                got.at(1).grad_norm, norm);
    EXPECT_NEAR(got.at(1).grad_norm, norm, 1e-5 * norm);
    for (int step = 1; step <= 4; ++step) {
      std::printf("step %d: loss %.7f, DeepSpeed's %.7f\n", step, got.at(step).loss,
                  want.at(step).loss);
      EXPECT_NEAR(got.at(step).loss, want.at(step).loss, 1e-4) << "step " << step;
    }
  }
};

TEST_F(DeepSpeedUlyssesInterop, TwoSequenceRanksTrainAsDeepSpeedUlysses) { compare(2); }

TEST_F(DeepSpeedUlyssesInterop, TwoReplicasOfTwoSequenceRanksTrainAsDeepSpeedUlysses) {
  compare(4);
}

}  // namespace
}  // namespace deepspeed

// train_gpt with MoE blocks under the deepspeed launcher on 2 ranks: --moe_* flags, the
// moe_aux_loss metric, DeepSpeed's MoE checkpoint files and an exact resume; with
// --tensor_parallel_size 2 on 4 ranks and with --activation_checkpointing, the same training as
// without them; in 2 pipeline stages x 2 replicas, and in 2 stages x 2 tensor-parallel ranks;
// a tensor-parallel checkpoint through ds_to_universal onto ranks without tensor parallelism.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/checkpoint.h"
#include "deepspeed/universal_checkpoint.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using testing::run_command;

constexpr const char* kConfig = R"({"train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2, "steps_per_print": 5, "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})";

// The same with ZeRO-2 and bf16: expert flats partitioned over the expert-data-parallel group.
constexpr const char* kZero2Bf16Config = R"({"train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2, "steps_per_print": 5, "gradient_clipping": 1.0,
    "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})";

// ZeRO-2 in fp32, and the same loading universal checkpoints.
constexpr const char* kZero2Config = R"({"train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2, "steps_per_print": 5, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})";
constexpr const char* kZero2UniversalConfig = R"({"train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2, "steps_per_print": 5, "gradient_clipping": 1.0,
    "zero_optimization": {"stage": 2}, "checkpoint": {"load_universal": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})";

std::string launch(const testing::TempDir& dir, int steps, const std::string& metrics,
                   const std::string& extra, const char* config = kConfig, int ranks = 2) {
  testing::write_text_file(dir.file("ds_config.json"), config);
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  return std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus " + std::to_string(ranks) +
         " --master_port " +
         std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
         " --deepspeed_config " + dir.file("ds_config.json") + " --data " +
         dir.file("corpus.txt") + " --steps " + std::to_string(steps) +
         (extra.find("--n_layer") == std::string::npos ? " --n_layer 2" : "") +
         " --n_head 2 --n_embd 32 --seq_len 32 --eval_batches 2 --metrics_file " +
         dir.file(metrics) +
         (extra.find("--moe_ep_size") == std::string::npos ? " --moe_ep_size 2" : "") +
         (extra.find("--moe_top_k") == std::string::npos ? " --moe_top_k 2" : "") +
         " --moe_num_experts 4 --moe_every 2"
         " --moe_capacity_factor 1.25 --moe_aux_loss_coef 0.01 " + extra;
}

std::vector<nlohmann::json> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The same losses, gradient norms and aux losses at each of 4 steps (to rounding: 1e-6).
void expect_same_training(const std::string& want_file, const std::string& got_file) {
  auto a = read_rows(want_file);
  auto b = read_rows(got_file);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    for (const char* key : {"loss", "grad_norm", "moe_aux_loss"}) {
      const double want = a[i][key].get<double>();
      EXPECT_NEAR(b[i][key].get<double>(), want, 1e-6 * std::abs(want)) << key << " step " << i;
    }
  }
}

TEST(TrainGptMoEE2E, TrainsWithExpertParallelismAndReportsTheAuxLoss) {
  testing::TempDir dir;
  auto r = run_command(launch(dir, 20, "metrics.jsonl", "--save_dir " + dir.file("ckpt")));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("moe_aux_loss"), std::string::npos) << r.out;
  auto rows = read_rows(dir.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 20u);
  for (const auto& row : rows) {
    // Top-2's E^2 * mean(me * ce) is 1 for a perfectly balanced gate and at most E.
    const double aux = row.at("moe_aux_loss").get<double>();
    EXPECT_TRUE(std::isfinite(aux) && aux > 0.5 && aux < 4.0) << row.dump();
  }
  EXPECT_LT(rows.back()["loss"].get<double>(), rows[0]["loss"].get<double>() - 1.0);
  // Block 1 (the second) is the MoE block: one file per expert, expp_rank per expert rank.
  const std::string tag = dir.file("ckpt") + "/global_step20/";
  for (int e = 0; e < 4; ++e) {
    EXPECT_TRUE(std::filesystem::exists(tag + "layer_0_expert_" + std::to_string(e) +
                                        "_mp_rank_00_model_states.pt")) << e;
  }
  EXPECT_TRUE(std::filesystem::exists(tag + "expp_rank_0_mp_rank_00_optim_states.pt"));
  EXPECT_TRUE(std::filesystem::exists(tag + "expp_rank_1_mp_rank_00_optim_states.pt"));
  EXPECT_TRUE(std::filesystem::exists(tag + "mp_rank_00_model_states.pt"));
}

// A resumed run's 3 rows are steps 4-6 of an uninterrupted run of 6: each of `keys` within a
// relative `rtol` (0: equal, to 4 ulps).
void expect_steps_4_to_6(const std::string& want_file, const std::string& got_file,
                         const std::vector<const char*>& keys, double rtol) {
  auto want = read_rows(want_file);
  auto got = read_rows(got_file);
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["step"], want[3 + i]["step"]);
    for (const char* key : keys) {
      const double w = want[3 + i][key].get<double>(), g = got[i][key].get<double>();
      if (rtol == 0.0) {
        EXPECT_DOUBLE_EQ(g, w) << key << " step " << 4 + i;
      } else {
        EXPECT_NEAR(g, w, rtol * std::abs(w)) << key << " step " << 4 + i;
      }
    }
  }
}

// 3 steps, save, resume to 6: the same losses as 6 steps straight (token dropping with random
// token selection and the Gumbel second expert included: the RNG states come back too).
void expect_exact_resume(const char* config, const std::string& extra = "", int ranks = 2) {
  testing::TempDir dir;
  auto full = run_command(launch(dir, 6, "full.jsonl", extra, config, ranks));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  auto first = run_command(
      launch(dir, 3, "first.jsonl", extra + " --save_dir " + dir.file("ckpt"), config, ranks));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second = run_command(
      launch(dir, 6, "second.jsonl", extra + " --load_dir " + dir.file("ckpt"), config, ranks));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  expect_steps_4_to_6(dir.file("full.jsonl"), dir.file("second.jsonl"), {"loss", "moe_aux_loss"},
                      0.0);
}

TEST(TrainGptMoEE2E, ResumeContinuesExactly) { expect_exact_resume(kConfig); }

TEST(TrainGptMoEE2E, ResumeContinuesExactlyUnderZero2Bf16) {
  expect_exact_resume(kZero2Bf16Config);
}

// Tensor parallelism with MoE: TP=2 x DP=2 on 4 ranks. AutoTP shards the experts' projections
// as the dense MLP's, and the expert groups are cut from each tensor-parallel rank's
// data-parallel group; so the losses and gradient norms are those of the 2 data-parallel ranks
// without TP (fp32: to rounding).
TEST(TrainGptMoEE2E, TensorParallelTrainsAsDataParallelRanks) {
  testing::TempDir dir;
  auto dp = run_command(launch(dir, 4, "dp.jsonl", ""));
  ASSERT_EQ(dp.exit_code, 0) << dp.out << dp.err;
  auto tp = run_command(launch(dir, 4, "tp.jsonl", "--tensor_parallel_size 2", kConfig, 4));
  ASSERT_EQ(tp.exit_code, 0) << tp.out << tp.err;
  EXPECT_NE(tp.out.find("deepspeed_experts.0.c_fc"), std::string::npos) << tp.out;  // sharded
  expect_same_training(dir.file("dp.jsonl"), dir.file("tp.jsonl"));
}

// --activation_checkpointing: each block is recomputed in backward, the MoE block's all-to-alls
// and random gating (random token selection, the Gumbel-sampled second expert, dropout) with
// the forward's RNG states, and its load-balancing loss leaves the checkpoint as a second
// output. So the losses, gradient norms and aux losses are those of the run without it; a
// load-balancing loss cut from the gate would change the gradient norm.
void expect_checkpointing_trains_as_without(const char* config, const std::string& extra = "",
                                            int ranks = 2) {
  testing::TempDir dir;
  auto plain = run_command(launch(dir, 4, "plain.jsonl", extra + " --dropout 0.1", config, ranks));
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  auto ckpt = run_command(launch(dir, 4, "ckpt.jsonl",
                                 extra + " --dropout 0.1 --activation_checkpointing", config,
                                 ranks));
  ASSERT_EQ(ckpt.exit_code, 0) << ckpt.out << ckpt.err;
  expect_same_training(dir.file("plain.jsonl"), dir.file("ckpt.jsonl"));
}

TEST(TrainGptMoEE2E, ActivationCheckpointingTrainsAsWithout) {
  expect_checkpointing_trains_as_without(kConfig);
}

TEST(TrainGptMoEE2E, ActivationCheckpointingTrainsAsWithoutUnderZero2Bf16) {
  expect_checkpointing_trains_as_without(kZero2Bf16Config);
}

// MoE blocks in pipeline stages: 2 stages x 2 data-parallel replicas on 4 ranks, the experts
// spread over each stage's replicas (ep_size 2), each stage training its gates with its own
// blocks' load-balancing losses. 4 blocks, so that an MoE block sits on each stage.
constexpr const char* kPipe =
    "--pipeline_parallel_size 2 --n_layer 4 --compact_vocab --val_fraction 0.2";

TEST(TrainGptMoEE2E, PipelineStagesTrainAndReportTheAuxLoss) {
  testing::TempDir dir;
  auto r = run_command(launch(dir, 10, "metrics.jsonl", kPipe, kConfig, 4));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  auto rows = read_rows(dir.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), 10u);
  for (const auto& row : rows) {
    // Two MoE blocks: the sum of two losses of 1 (balanced) to 4 each.
    const double aux = row.at("moe_aux_loss").get<double>();
    EXPECT_TRUE(std::isfinite(aux) && aux > 1.0 && aux < 8.0) << row.dump();
  }
  EXPECT_LT(rows.back()["loss"].get<double>(), rows[0]["loss"].get<double>() - 0.3);
}

// The held-out loss before training runs on a copy of the generator's state: it draws from it
// (the second expert's sampling) and would otherwise shift the resumed run's draws.
TEST(TrainGptMoEE2E, PipelineResumesExactly) { expect_exact_resume(kConfig, kPipe, 4); }

TEST(TrainGptMoEE2E, PipelineActivationCheckpointingTrainsAsWithout) {
  expect_checkpointing_trains_as_without(kConfig, kPipe, 4);
}

// 3D: P=2 x TP=2 on 4 ranks (AutoTP shards the experts inside each stage) trains as P=2 on 2.
TEST(TrainGptMoEE2E, PipelineWithTensorParallelTrainsAsThePipelineAlone) {
  testing::TempDir dir;
  const std::string pipe = std::string(kPipe) + " --moe_ep_size 1";
  auto p2 = run_command(launch(dir, 4, "p2.jsonl", pipe, kConfig, 2));
  ASSERT_EQ(p2.exit_code, 0) << p2.out << p2.err;
  auto p2t2 =
      run_command(launch(dir, 4, "p2t2.jsonl", pipe + " --tensor_parallel_size 2", kConfig, 4));
  ASSERT_EQ(p2t2.exit_code, 0) << p2t2.out << p2t2.err;
  expect_same_training(dir.file("p2.jsonl"), dir.file("p2t2.jsonl"));
}

// A TP=2 x DP=2 checkpoint of experts sharded by AutoTP (ZeRO-2: expert partitions over the
// expert-data-parallel group) converts to a universal checkpoint whose experts are whole (each
// the join of its shards in the expert files), which zero_to_fp32 agrees with, and which
// resumes on 2 ranks without TP as the run that never had TP. Deterministic gating (top-1, no
// dropping): the RNG states do not carry over to another world size.
TEST(TrainGptMoEE2E, TensorParallelCheckpointConvertsAndResumesWithoutTensorParallelism) {
  testing::TempDir dir;
  const std::string gating = " --moe_top_k 1 --moe_drop_tokens false";
  auto dp = run_command(launch(dir, 6, "dp.jsonl", gating, kZero2Config));
  ASSERT_EQ(dp.exit_code, 0) << dp.out << dp.err;
  auto tp = run_command(launch(dir, 3, "tp.jsonl",
                               gating + " --tensor_parallel_size 2 --save_dir " + dir.file("ckpt"),
                               kZero2Config, 4));
  ASSERT_EQ(tp.exit_code, 0) << tp.out << tp.err;
  const std::string tag = dir.file("ckpt") + "/global_step3";
  const std::string universal = dir.file("ckpt") + "/global_step3_universal";
  const auto converted = checkpoint::ds_to_universal(tag, universal);
  EXPECT_EQ(converted.tp_degree, 2);
  const checkpoint::TensorDict full = checkpoint::consolidate_zero_checkpoint(
      dir.file("ckpt"), std::string("global_step3"));
  int experts = 0;
  for (int e = 0; e < 4; ++e) {
    const std::string prefix =
        "h.1.mlp.deepspeed_moe.experts.deepspeed_experts." + std::to_string(e) + ".";
    for (const auto& [name, dim] : std::vector<std::pair<std::string, int>>{
             {"c_fc.weight", 0}, {"c_fc.bias", 0}, {"c_proj.weight", 1}}) {
      const at::Tensor whole = checkpoint::load_universal_state(universal, prefix + name, "fp32");
      std::vector<at::Tensor> shards;
      for (int t = 0; t < 2; ++t) {
        const std::string file = tag + "/layer_0_expert_" + std::to_string(e) + "_mp_rank_0" +
                                 std::to_string(t) + "_model_states.pt";
        shards.push_back(
            checkpoint::load(file).toGenericDict().at(prefix + name).toTensor().to(at::kFloat));
      }
      EXPECT_TRUE(whole.equal(at::cat(shards, dim))) << prefix + name;
      EXPECT_EQ(whole.size(dim), 4 * 32) << prefix + name;  // whole: 4 * n_embd
      const at::Tensor* consolidated = full.find(prefix + name);
      ASSERT_NE(consolidated, nullptr) << prefix + name;
      EXPECT_TRUE(consolidated->equal(whole)) << prefix + name;
      ++experts;
    }
  }
  EXPECT_EQ(experts, 12);
  auto resumed = run_command(launch(dir, 6, "resumed.jsonl",
                                    gating + " --load_dir " + dir.file("ckpt"),
                                    kZero2UniversalConfig));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  expect_steps_4_to_6(dir.file("dp.jsonl"), dir.file("resumed.jsonl"),
                      {"loss", "grad_norm", "moe_aux_loss"}, 1e-6);
}

TEST(TrainGptMoEE2E, RefusesAnEpSizeThatDoesNotDivideTheWorld) {
  testing::TempDir dir;
  auto r = run_command(launch(dir, 2, "m.jsonl", "--moe_ep_size 4"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("ep_size (4) must divide the data-parallel world size (2)"),
            std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace deepspeed

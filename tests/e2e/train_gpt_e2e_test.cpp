// train_gpt under the deepspeed launcher on 2 ranks, for a few steps on the committed corpus
// fixture: the loss goes down, the metrics file is written, and a bad config fails loudly.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/indexed_dataset.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/test_port.h"

namespace deepspeed {
namespace {

using testing::run_command;

std::string launch(const testing::TempDir& dir, const std::string& config_json, int steps,
                   const std::string& metrics = "metrics.jsonl", const std::string& extra = "",
                   int n_layer = 1, int ranks = 2) {
  testing::write_text_file(dir.file("ds_config.json"), config_json);
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  return std::string("OMP_NUM_THREADS=1 ") + DS_LAUNCHER_BIN + " --num_gpus " +
         std::to_string(ranks) + " --master_port " +
         std::to_string(testing::reserve_port()) + " " + DS_TRAIN_GPT_BIN +
         " --deepspeed_config " + dir.file("ds_config.json") + " --data " +
         dir.file("corpus.txt") + " --steps " + std::to_string(steps) +
         " --n_layer " + std::to_string(n_layer) +
         " --n_head 2 --n_embd 32 --seq_len 32 --eval_batches 2 --metrics_file " +
         dir.file(metrics) + " " + extra;
}

std::vector<nlohmann::json> read_rows(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(in, line)) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// One value per item of an MMapIndexedDataset (the analyzer's sample_to_metric).
std::vector<int64_t> read_rows_of_dataset(const std::string& prefix) {
  const deepspeed::data_sampling::MMapIndexedDataset d(prefix);
  std::vector<int64_t> out;
  for (size_t i = 0; i < d.size(); ++i) out.push_back(d.item(i).at(0));
  return out;
}

// A run that diverges for real (fp32, SGD with lr 1e6) stops at the first non-finite loss with
// exit status 1 and an error naming the step and the ranks, after writing the steps before it;
// --continue_on_nonfinite_loss trains on to the end as before.
TEST(TrainGptE2E, DivergingRunStopsAtTheFirstNonFiniteLoss) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
      "gradient_clipping": 0.0, "optimizer": {"type": "SGD", "params": {"lr": 1e6}}})";
  auto r = run_command(launch(dir, cfg, 12));
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  const std::string all = r.out + r.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(all, m, std::regex(R"(train_gpt: \[rank 1\] error: step (\d+): the training loss is not finite on ranks? [0-9, ]+ \(rank 0: [^,]+, rank 1: )")))
      << all;
  EXPECT_NE(all.find("train_gpt: [rank 0] error: step " + m[1].str()), std::string::npos) << all;
  EXPECT_NE(all.find("--continue_on_nonfinite_loss"), std::string::npos) << all;
  const int stop = std::stoi(m[1].str());
  EXPECT_LE(stop, 12);
  auto rows = read_rows(dir.file("metrics.jsonl"));
  ASSERT_EQ(rows.size(), static_cast<size_t>(stop - 1)) << all;  // the steps before it
  for (const auto& row : rows) EXPECT_TRUE(std::isfinite(row["loss"].get<double>())) << row;

  auto go_on = run_command(launch(dir, cfg, 12, "on.jsonl", "--continue_on_nonfinite_loss"));
  EXPECT_EQ(go_on.exit_code, 0) << go_on.out << go_on.err;
  EXPECT_EQ(read_rows(dir.file("on.jsonl")).size(), 12u);
}

TEST(TrainGptE2E, TwoRanksTrainAndHeldOutLossDrops) {
  testing::TempDir dir;
  auto r = run_command(launch(dir, R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 5,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.0}}})", 25));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] step 5 | loss"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokens/s"), std::string::npos);
  // One line per print interval (steps 1, 5, 10, ..., 25), each with the progress and ETA;
  // DeepSpeed's per-interval lines only with --deepspeed_log.
  const std::regex step_line(R"(\[rank 0\] step (\d+) \| loss [0-9.]+ \| lr [0-9.e+-]+ \| grad_norm [0-9.]+ .*\| ETA \d+h\d\dm\d\ds)");
  int step_lines = 0;
  for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), step_line);
       it != std::sregex_iterator(); ++it) {
    ++step_lines;
  }
  EXPECT_EQ(step_lines, 6) << r.out;
  EXPECT_EQ(r.out.find("RunningAvgSamplesPerSec"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("skipped=0, lr="), std::string::npos) << r.out;
  // The engine reports the optimizer states once they exist.
  EXPECT_NE(r.out.find("memory after the first optimizer step (steady state)"), std::string::npos)
      << r.out;

  std::ifstream metrics(dir.file("metrics.jsonl"));
  std::string line;
  std::vector<nlohmann::json> rows;
  while (std::getline(metrics, line)) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 25u);
  EXPECT_EQ(rows.back()["step"], 25);
  EXPECT_EQ(rows.back()["samples"], 25 * 8);
  EXPECT_EQ(rows.back()["rss_bytes"].size(), 2u);
  EXPECT_GT(rows.back()["peak_rss_bytes"][1].get<int64_t>(), 0);
  // The engine's ledger per component and rank: AdamW holds two fp32 moments per parameter.
  const auto& memory = rows.back()["memory_bytes"];
  for (const char* key : {"parameters", "gradients", "optimizer_states", "device", "rss"}) {
    ASSERT_EQ(memory[key].size(), 2u) << key;
    EXPECT_GT(memory[key][1].get<int64_t>(), 0) << key;
  }
  EXPECT_EQ(memory["optimizer_states"][0].get<int64_t>(),
            2 * memory["parameters"][0].get<int64_t>());
  EXPECT_GT(rows[0]["tokens_per_s"].get<double>(), 0.0);
  EXPECT_LT(rows.back()["loss"].get<double>(), rows[0]["loss"].get<double>() - 1.0);

  // "held-out loss A -> B": B clearly below A.
  auto pos = r.out.find("held-out loss ", r.out.find("done:"));
  ASSERT_NE(pos, std::string::npos) << r.out;
  double before = 0, after = 0;
  ASSERT_EQ(std::sscanf(r.out.c_str() + pos, "held-out loss %lf -> %lf", &before, &after), 2);
  EXPECT_LT(after, before - 1.0) << r.out;
}

// --save_dir / --load_dir: 3 steps, save, a new job resumes to step 6; steps 4-6 have exactly
// the losses of an uninterrupted 6-step run (ZeRO-2, warmup schedule, data position restored).
TEST(TrainGptE2E, ResumeFromSaveDirContinuesExactly) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 2, "steps_per_print": 100,
      "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5}}})";
  auto full = run_command(launch(dir, cfg, 6, "full.jsonl"));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  auto first = run_command(launch(dir, cfg, 3, "first.jsonl",
                                  "--save_dir " + dir.file("ckpt") + " --save_interval 2"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  std::ifstream latest(dir.file("ckpt/latest"));
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "global_step3");
  EXPECT_TRUE(std::ifstream(dir.file("ckpt/global_step2/mp_rank_00_model_states.pt")).good());
  auto second = run_command(launch(dir, cfg, 6, "second.jsonl", "--load_dir " + dir.file("ckpt")));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE(second.out.find("resumed from"), std::string::npos) << second.out;
  auto want = read_rows(dir.file("full.jsonl"));
  auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["step"], want[i + 3]["step"]);
    EXPECT_EQ(got[i]["samples"], want[i + 3]["samples"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
    EXPECT_EQ(got[i]["lr"].get<double>(), want[i + 3]["lr"].get<double>()) << "step " << i + 4;
  }
}

// A "seqlen" curriculum and progressive layer drop under ZeRO-3: each step trains on the
// scheduled length (DeepSpeed's fixed_linear: 8, 12, 16, 20, 20, 24 of 32 tokens), the metrics
// count the tokens trained on, blocks are skipped with PLD's probability, and a resumed run
// continues both exactly (the schedule follows the global step, the draws the restored RNG).
TEST(TrainGptE2E, SeqlenCurriculumAndLayerDropResumeExactlyUnderZero3) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
      "zero_optimization": {"stage": 3},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "progressive_layer_drop": {"enabled": true, "theta": 0.5, "gamma": 0.5},
      "curriculum_learning": {"enabled": true, "curriculum_type": "seqlen",
        "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_linear",
        "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 4}}})";
  auto full = run_command(launch(dir, cfg, 6, "full.jsonl", "", /*n_layer=*/3));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_NE(full.out.find("Enabled progressive layer dropping (theta = 0.5)"), std::string::npos)
      << full.out;
  auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  const int64_t lengths[] = {8, 12, 16, 20, 20, 24};
  int64_t tokens = 0;
  for (size_t i = 0; i < 6; ++i) {
    tokens += 4 * lengths[i];  // 2 samples x 2 ranks
    EXPECT_EQ(want[i]["seq_len"], lengths[i]) << "step " << i + 1;
    EXPECT_EQ(want[i]["tokens"], tokens) << "step " << i + 1;
    EXPECT_TRUE(std::isfinite(want[i]["loss"].get<double>())) << want[i];
  }
  auto first =
      run_command(launch(dir, cfg, 3, "first.jsonl", "--save_dir " + dir.file("ckpt"), 3));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second =
      run_command(launch(dir, cfg, 6, "second.jsonl", "--load_dir " + dir.file("ckpt"), 3));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["seq_len"], want[i + 3]["seq_len"]) << "step " << i + 4;
    EXPECT_EQ(got[i]["tokens"], want[i + 3]["tokens"]) << "step " << i + 4;
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
  }
}

// Random-LTD under ZeRO-3: blocks 0 and 2 of 3 keep DeepSpeed's scheduled number of tokens
// (fixed_linear from 8 to all 32 over 4 steps, multiples of 8), the metrics count the consumed
// layer-tokens, the dropped tokens change the loss, and a resumed run continues exactly (the
// schedule from the checkpoint's 'random_ltd', the draws from the restored RNG).
TEST(TrainGptE2E, RandomLtdFollowsItsScheduleAndResumesExactlyUnderZero3) {
  testing::TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 2,
      "steps_per_print": 100, "zero_optimization": {"stage": 3},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  const std::string plain = cfg.dump();
  cfg["data_efficiency"] = nlohmann::json::parse(R"({"enabled": true, "data_routing": {
      "enabled": true, "random_ltd": {"enabled": true, "total_layer_num": 3,
        "random_ltd_layer_num": 2, "random_ltd_layer_id": [0, 2], "model_mask_name": null,
        "model_type": "decoder", "hidden_state_order": "batch_seq_dim",
        "random_ltd_schedule": {"min_value": 8, "max_value": 32, "schedule_type": "fixed_linear",
          "schedule_config": {"require_steps": 4, "seq_per_step": 8}}}}})");
  auto full = run_command(launch(dir, cfg.dump(), 6, "full.jsonl", "", /*n_layer=*/3));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  const int64_t kept[] = {8, 8, 16, 24, 32, 32};
  int64_t consumed = 0;
  for (size_t i = 0; i < 6; ++i) {
    consumed += 4 * (kept[i] * 2 + 32);  // train batch 4: 2 dropping blocks, 1 full
    EXPECT_EQ(want[i]["random_ltd_seq"], kept[i]) << "step " << i + 1;
    EXPECT_EQ(want[i]["consumed_layer_tokens"], consumed) << "step " << i + 1;
    EXPECT_EQ(want[i]["seq_len"], 32) << "step " << i + 1;  // the batches stay whole
    EXPECT_TRUE(std::isfinite(want[i]["loss"].get<double>())) << want[i];
  }
  auto without = run_command(launch(dir, plain, 1, "plain.jsonl", "", 3));
  ASSERT_EQ(without.exit_code, 0) << without.out << without.err;
  EXPECT_NE(read_rows(dir.file("plain.jsonl"))[0]["loss"].get<double>(),
            want[0]["loss"].get<double>());
  auto first = run_command(
      launch(dir, cfg.dump(), 3, "first.jsonl", "--save_dir " + dir.file("ckpt"), 3));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second = run_command(
      launch(dir, cfg.dump(), 6, "second.jsonl", "--load_dir " + dir.file("ckpt"), 3));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["random_ltd_seq"], want[i + 3]["random_ltd_seq"]) << "step " << i + 4;
    EXPECT_EQ(got[i]["consumed_layer_tokens"], want[i + 3]["consumed_layer_tokens"])
        << "step " << i + 4;
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
  }
}

// data_efficiency.data_sampling's curriculum: train_gpt analyzes its windows' vocab_rarity on
// both ranks (DeepSpeed's index files), the engine's sampler admits the easiest windows first
// and more as the percentile rises, and a resumed run draws the same windows (same losses).
nlohmann::json vocab_rarity_curriculum(const testing::TempDir& dir) {
  const std::string analysis = dir.file("analysis/vocab_rarity/vocab_rarity");
  return {
      {"enabled", true},
      {"data_sampling",
       {{"enabled", true},
        {"curriculum_learning",
         {{"enabled", true},
          {"data_cluster_path", dir.file("clusters")},
          {"curriculum_metrics",
           {{"vocab_rarity",
             {{"index_to_sample_path", analysis + "_index_to_sample_percentile_merged"},
              {"index_to_metric_path", analysis + "_index_to_metric"},
              {"difficulty_type", "percentile"},
              {"clustering_type", "schedule_based"},
              {"min_difficulty", 20},
              {"max_difficulty", 100},
              {"schedule_type", "fixed_linear"},
              {"schedule_config", {{"total_curriculum_step", 4}, {"difficulty_step", 1}}}}}}}}}}}};
}

TEST(TrainGptE2E, DataSamplingCurriculumTrainsEasyWindowsFirstAndResumesExactly) {
  testing::TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 2,
      "steps_per_print": 100, "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  const std::string plain = cfg.dump();
  const std::string analysis = dir.file("analysis/vocab_rarity/vocab_rarity");
  cfg["data_efficiency"] = vocab_rarity_curriculum(dir);
  auto full = run_command(launch(dir, cfg.dump(), 6, "full.jsonl"));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  const auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  const int64_t percentile[] = {40, 60, 80, 100, 100, 100};  // 20 + 80 t / 4
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(want[i]["curriculum_difficulty"]["vocab_rarity"], percentile[i]) << "step " << i + 1;
  }
  // The first cluster: the 40% of windows with the lowest vocab_rarity (up to ties).
  const auto rarity = read_rows_of_dataset(analysis + "_sample_to_metric");
  const data_sampling::MMapIndexedDataset first(dir.file("clusters/cluster_vocab_rarity40"));
  const auto admitted = first.item(0);
  ASSERT_FALSE(admitted.empty());
  std::vector<bool> in_first(rarity.size(), false);
  int64_t hardest_admitted = 0;
  for (int64_t w : admitted) {
    in_first[static_cast<size_t>(w)] = true;
    hardest_admitted = std::max(hardest_admitted, rarity[static_cast<size_t>(w)]);
  }
  for (size_t w = 0; w < rarity.size(); ++w) {
    if (!in_first[w]) EXPECT_GE(rarity[w], hardest_admitted) << "window " << w;
  }
  EXPECT_EQ(admitted.size(), rarity.size() / 100 * 40);

  auto without = run_command(launch(dir, plain, 1, "plain.jsonl"));
  ASSERT_EQ(without.exit_code, 0) << without.out << without.err;
  EXPECT_NE(read_rows(dir.file("plain.jsonl"))[0]["loss"].get<double>(),
            want[0]["loss"].get<double>());
  auto first_run = run_command(launch(dir, cfg.dump(), 3, "first.jsonl",
                                      "--save_dir " + dir.file("ckpt")));
  ASSERT_EQ(first_run.exit_code, 0) << first_run.out << first_run.err;
  auto second = run_command(launch(dir, cfg.dump(), 6, "second.jsonl",
                                   "--load_dir " + dir.file("ckpt")));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  const auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["curriculum_difficulty"], want[i + 3]["curriculum_difficulty"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
  }
}

// data_efficiency.data_sampling.dynamic_batching: train_gpt's documents (cut at line ends, 8 to
// 32 tokens) packed into micro-batches of at most 128 tokens on 2 ranks. A step trains many
// more sequences than train_batch_size's 4 and their number varies; the rate each update uses
// is WarmupLR's for its step times its batch's sequences over 4 (DeepSpeed's
// VariableBatchSizeLR); a resumed run repeats the uninterrupted one.
TEST(TrainGptE2E, DynamicBatchingPacksDocumentsScalesTheRateAndResumesExactly) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 2, "steps_per_print": 100,
      "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-3,
                                                   "warmup_num_steps": 3}},
      "data_efficiency": {"enabled": true, "seed": 3, "data_sampling": {"enabled": true,
        "dynamic_batching": {"enabled": true, "max_tokens": 128,
                             "sequence_picking_order": "random"}}}})";
  auto full = run_command(launch(dir, cfg, 6, "full.jsonl"));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_NE(full.out.find("dynamic batching: "), std::string::npos) << full.out;
  const auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  std::set<int64_t> sizes;
  int64_t tokens = 0;
  for (size_t i = 0; i < 6; ++i) {
    const int64_t sequences = want[i]["sequences"].get<int64_t>();
    EXPECT_GT(sequences, 8) << "step " << i + 1;  // several documents per micro-batch
    sizes.insert(sequences);
    const int64_t step_tokens = want[i]["tokens"].get<int64_t>() - tokens;
    tokens = want[i]["tokens"].get<int64_t>();
    EXPECT_LE(step_tokens, 4 * 128) << "step " << i + 1;
    EXPECT_GT(step_tokens, 4 * 32) << "step " << i + 1;
  }
  EXPECT_GT(sizes.size(), 1u);
  // The rate after step s is the one update s + 1 trains with: WarmupLR's (log warm-up over 3
  // steps) for step s, scaled by step s + 1's sequences.
  for (size_t s = 1; s < 6; ++s) {
    const double warmup = s < 3 ? 3e-3 * std::log(s + 1.0) / std::log(3.0) : 3e-3;
    EXPECT_NEAR(want[s - 1]["lr"].get<double>(),
                warmup * want[s]["sequences"].get<double>() / 4.0, 1e-9)
        << "after step " << s;
  }

  auto first = run_command(launch(dir, cfg, 3, "first.jsonl", "--save_dir " + dir.file("ckpt")));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second =
      run_command(launch(dir, cfg, 6, "second.jsonl", "--load_dir " + dir.file("ckpt")));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  const auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["sequences"], want[i + 3]["sequences"]) << "step " << i + 4;
    EXPECT_EQ(got[i]["tokens"], want[i + 3]["tokens"]) << "step " << i + 4;
    EXPECT_EQ(got[i]["lr"].get<double>(), want[i + 3]["lr"].get<double>()) << "step " << i + 4;
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
  }
}

// compression_training from the ds_config (ZeRO-2, 2 ranks): 8-bit weights from step 2, topk
// row pruning of each MLP from step 4 with its projection as related layer. A run resumed at
// step 3 trains steps 4-6 as the uninterrupted one (the scheduler goes on at the saved step);
// redundancy_clean then halves each MLP's hidden rows, and the cleaned model scores as the
// trained one.
TEST(TrainGptE2E, CompressionResumesExactlyAndRedundancyCleanShrinksTheMlp) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
      "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "compression_training": {
        "weight_quantization": {
          "shared_parameters": {"enabled": true, "quantize_weight_in_forward": true,
                                "quantize_groups": 4, "schedule_offset": 2},
          "different_groups": {"w8": {"params": {"start_bits": 8, "target_bits": 8},
                                      "modules": ["attn.c_attn", "mlp.c_proj"]}}},
        "row_pruning": {
          "shared_parameters": {"enabled": true, "method": "topk", "schedule_offset": 4},
          "different_groups": {"mlp": {"params": {"dense_ratio": 0.5}, "modules": ["mlp.c_fc"],
                                       "related_modules": [["mlp.c_proj"]]}}}}})";
  auto full = run_command(launch(dir, cfg, 6, "full.jsonl", "", 2));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  EXPECT_NE(full.out.find("Row pruning is enabled at step 4"), std::string::npos) << full.out;
  // Two blocks: each MLP's c_fc loses 64 of its 128 rows (with their biases and row scores)
  // and c_proj 64 of its 128 input columns: 2 * (64 * 32 + 64 + 128 + 64 * 32) = 8576.
  const auto at = full.out.find("redundancy_clean: ");
  ASSERT_NE(at, std::string::npos) << full.out;
  long long before = 0, after = 0;
  double cleaned = 0.0;
  ASSERT_EQ(std::sscanf(full.out.c_str() + at, "redundancy_clean: %lld -> %lld parameters | "
                        "held-out loss %lf", &before, &after, &cleaned), 3) << full.out;
  EXPECT_EQ(before - after, 8576);
  const auto trained_at = full.out.find(" -> ", full.out.find("train_gpt: done"));
  ASSERT_NE(trained_at, std::string::npos);
  EXPECT_NEAR(std::stod(full.out.substr(trained_at + 4)), cleaned, 1e-4) << full.out;

  const auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 6u);
  auto first =
      run_command(launch(dir, cfg, 3, "first.jsonl", "--save_dir " + dir.file("ckpt"), 2));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second =
      run_command(launch(dir, cfg, 6, "second.jsonl", "--load_dir " + dir.file("ckpt"), 2));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  const auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 3]["loss"].get<double>()) << "step " << i + 4;
  }
}

// sparse_attention from the ds_config (ZeRO-2, 2 ranks, blocks of 8 of the 32 tokens): the dense
// pattern trains as the plain causal attention does (to float rounding), the fixed
// unidirectional one (local windows of 2 blocks) differently, and a run of it resumed at step 2
// repeats the uninterrupted one exactly (the layout is saved as each block's buffer).
TEST(TrainGptE2E, SparseAttentionTrainsAndResumesExactly) {
  testing::TempDir dir;
  const std::string base = R"({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 100,
      "zero_optimization": {"stage": 2},
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}})";
  auto run = [&](const std::string& cfg, int steps, const std::string& metrics,
                 const std::string& extra = "") {
    auto r = run_command(launch(dir, cfg, steps, metrics, extra, 2));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return read_rows(dir.file(metrics));
  };
  const auto plain = run(base + "}", 4, "plain.jsonl");
  const auto dense =
      run(base + R"(, "sparse_attention": {"mode": "dense", "block": 8}})", 4, "dense.jsonl");
  const std::string fixed_cfg = base + R"(, "sparse_attention": {"mode": "fixed", "block": 8,
      "num_local_blocks": 2, "attention": "unidirectional"}})";
  const auto fixed = run(fixed_cfg, 4, "fixed.jsonl");
  ASSERT_EQ(plain.size(), 4u);
  ASSERT_EQ(dense.size(), 4u);
  ASSERT_EQ(fixed.size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(dense[i]["loss"].get<double>(), plain[i]["loss"].get<double>(), 1e-5) << i;
  }
  // The first step's forward already attends differently.
  EXPECT_GT(std::abs(fixed[0]["loss"].get<double>() - plain[0]["loss"].get<double>()), 1e-4);

  run(fixed_cfg, 2, "first.jsonl", "--save_dir " + dir.file("ckpt"));
  const auto resumed = run(fixed_cfg, 4, "second.jsonl", "--load_dir " + dir.file("ckpt"));
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(resumed[i]["loss"].get<double>(), fixed[i + 2]["loss"].get<double>()) << i;
  }
  // A sequence length the blocks do not divide is refused before training.
  auto bad = run_command(launch(dir, base + R"(, "sparse_attention": {"block": 12}})", 1,
                                "bad.jsonl", "", 2));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE((bad.out + bad.err).find("--seq_len 32 is not a multiple of sparse_attention.block 12"),
            std::string::npos)
      << bad.out << bad.err;
}

// The same curriculum in a pipeline of 2 stages with 2 data-parallel replicas (4 ranks): the
// first and last stages each draw the windows over their replicas (a broadcast per global
// batch), alike, and a resumed run repeats the uninterrupted one.
TEST(TrainGptE2E, DataSamplingCurriculumInAPipelineResumesExactly) {
  testing::TempDir dir;
  nlohmann::json cfg = nlohmann::json::parse(R"({"train_micro_batch_size_per_gpu": 1,
      "gradient_accumulation_steps": 2, "steps_per_print": 100,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})");
  cfg["data_efficiency"] = vocab_rarity_curriculum(dir);
  const std::string pipe = "--compact_vocab --pipeline_parallel_size 2";
  auto full = run_command(launch(dir, cfg.dump(), 4, "full.jsonl", pipe, 2, 4));
  ASSERT_EQ(full.exit_code, 0) << full.out << full.err;
  const auto want = read_rows(dir.file("full.jsonl"));
  ASSERT_EQ(want.size(), 4u);
  const int64_t percentile[] = {40, 60, 80, 100};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(want[i]["curriculum_difficulty"]["vocab_rarity"], percentile[i]) << "step " << i + 1;
  }
  auto first = run_command(launch(dir, cfg.dump(), 2, "first.jsonl",
                                  pipe + " --save_dir " + dir.file("ckpt"), 2, 4));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto second = run_command(launch(dir, cfg.dump(), 4, "second.jsonl",
                                   pipe + " --load_dir " + dir.file("ckpt"), 2, 4));
  ASSERT_EQ(second.exit_code, 0) << second.out << second.err;
  EXPECT_NE((second.out + second.err).find("data sampler (curriculum step 2)"), std::string::npos)
      << second.out << second.err;
  const auto got = read_rows(dir.file("second.jsonl"));
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i]["curriculum_difficulty"], want[i + 2]["curriculum_difficulty"]);
    EXPECT_EQ(got[i]["loss"].get<double>(), want[i + 2]["loss"].get<double>()) << "step " << i + 3;
  }
}

// --load_dir with a typo, or a folder without `latest`, is refused before anything is trained
// or saved (the engine only warns, as DeepSpeed): exit non-zero, the folder and what was looked
// for named, and the checkpoint already in --save_dir untouched.
TEST(TrainGptE2E, LoadDirWithNothingToResumeIsRefused) {
  testing::TempDir dir;
  const std::string cfg = R"({"train_micro_batch_size_per_gpu": 2,
      "gradient_accumulation_steps": 1, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})";
  std::filesystem::create_directories(dir.file("ckpt/global_step7"));
  std::filesystem::create_directories(dir.file("empty"));
  testing::write_text_file(dir.file("ckpt/latest"), "global_step7");
  testing::write_text_file(dir.file("ckpt/global_step7/mp_rank_00_model_states.pt"), "weights");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir.file("ckpt_typo"),
       "the directory does not exist (looked for " + dir.file("ckpt_typo") + "/latest)"},
      {dir.file("empty"), "it has no 'latest' file (" + dir.file("empty") + "/latest"}};
  for (const auto& [load_dir, why] : cases) {
    auto r = run_command(launch(dir, cfg, 2, "metrics.jsonl",
                                "--load_dir " + load_dir + " --save_dir " + dir.file("ckpt") +
                                    " --save_interval 1"));
    EXPECT_NE(r.exit_code, 0) << r.out << r.err;
    const std::string all = r.out + r.err;
    EXPECT_NE(all.find("--load_dir " + load_dir + ": nothing to resume from: " + why),
              std::string::npos) << all;
    EXPECT_EQ(all.find("step 1 | loss"), std::string::npos) << all;
  }
  std::ifstream latest(dir.file("ckpt/latest"));
  std::string tag;
  latest >> tag;
  EXPECT_EQ(tag, "global_step7");
  std::ifstream weights(dir.file("ckpt/global_step7/mp_rank_00_model_states.pt"));
  std::string content;
  weights >> content;
  EXPECT_EQ(content, "weights");
  EXPECT_FALSE(std::filesystem::exists(dir.file("ckpt/global_step1")));
}

// ZeRO-3 with the model built inside zero::Init, its blocks as units, parameters and optimizer
// state swapped to NVMe files: the same losses as ZeRO-0 (fp32, within 1e-5 relative).
TEST(TrainGptE2E, Zero3WithNvmeOffloadTracksZero0) {
  testing::TempDir dir;
  auto config = [&](const std::string& zero) {
    return R"({"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "steps_per_print": 100, "gradient_clipping": 1.0,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": )" + zero + "}";
  };
  auto plain = run_command(launch(dir, config(R"({"stage": 0})"), 5, "zero0.jsonl"));
  ASSERT_EQ(plain.exit_code, 0) << plain.out << plain.err;
  const std::string nvme = dir.file("nvme");
  auto z3 = run_command(launch(
      dir,
      config(R"({"stage": 3, "stage3_param_persistence_threshold": 0, "sub_group_size": 1000,
        "offload_optimizer": {"device": "nvme", "nvme_path": ")" + nvme + R"(",
                              "pipeline_read": true, "pipeline_write": true},
        "offload_param": {"device": "nvme", "nvme_path": ")" + nvme + R"(", "max_in_cpu": 0}})"),
      5, "zero3.jsonl"));
  ASSERT_EQ(z3.exit_code, 0) << z3.out << z3.err;
  EXPECT_EQ(z3.err.find("could not gather"), std::string::npos) << z3.err;
  EXPECT_NE(z3.out.find("offload optimizer nvme, param nvme"), std::string::npos) << z3.out;
  auto want = read_rows(dir.file("zero0.jsonl"));
  auto got = read_rows(dir.file("zero3.jsonl"));
  ASSERT_EQ(want.size(), 5u);
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const double w = want[i]["loss"].get<double>();
    EXPECT_NEAR(got[i]["loss"].get<double>(), w, 1e-5 * w) << "step " << i + 1;
  }
}

// DeepSpeed's elasticity: one config, batch 8 on 1 rank (micro-batch 2, 4 accumulation steps) and
// on 2 (2 steps each). The sampler hands the two ranks together the windows one rank takes, so
// the losses agree step by step, and a job saved on 2 ranks resumes on 1 where it stopped: the
// ZeRO-1 optimizer partitions are laid out again and the data position counts windows, not
// micro-batches. The job can move between the sizes without changing training.
TEST(TrainGptE2E, ElasticConfigTrainsAlikeOnOneAndTwoRanksAndResumesAcrossThem) {
  testing::TempDir dir;
  const std::string config = R"({"steps_per_print": 100, "zero_optimization": {"stage": 1},
    "elasticity": {"enabled": true, "max_train_batch_size": 8, "micro_batch_sizes": [1, 2],
                   "min_gpus": 1, "max_gpus": 4, "version": 0.1},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}}})";
  for (int ranks : {1, 2}) {
    auto r = run_command(launch(dir, config, 4, "ranks" + std::to_string(ranks) + ".jsonl", "", 1,
                                ranks));
    ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  }
  auto first = run_command(launch(dir, config, 2, "first.jsonl",
                                  "--save_dir " + dir.file("ckpt") + " --save_interval 2"));
  ASSERT_EQ(first.exit_code, 0) << first.out << first.err;
  auto resumed = run_command(launch(dir, config, 4, "resumed.jsonl",
                                    "--load_dir " + dir.file("ckpt"), 1, /*ranks=*/1));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from"), std::string::npos) << resumed.out;
  auto one = read_rows(dir.file("ranks1.jsonl"));
  auto two = read_rows(dir.file("ranks2.jsonl"));
  auto after = read_rows(dir.file("resumed.jsonl"));
  ASSERT_EQ(one.size(), 4u);
  ASSERT_EQ(two.size(), 4u);
  ASSERT_EQ(after.size(), 2u);
  for (size_t i = 0; i < 4; ++i) {
    const double want = two[i]["loss"].get<double>();
    EXPECT_NEAR(one[i]["loss"].get<double>(), want, 1e-5 * want) << "step " << i + 1;
    EXPECT_EQ(one[i]["samples"], two[i]["samples"]) << "step " << i + 1;
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(after[i]["step"], two[i + 2]["step"]);
    const double want = two[i + 2]["loss"].get<double>();
    EXPECT_NEAR(after[i]["loss"].get<double>(), want, 1e-5 * want) << "step " << i + 3;
  }
}

TEST(TrainGptE2E, UnsupportedConfigFailsEveryRankWithTheKeyName) {
  testing::TempDir dir;
  auto r = run_command(launch(dir, R"({"train_batch_size": 4,
      "zero_optimization": {"stage": 3, "zenflow": {}},
      "optimizer": {"type": "AdamW"}})", 2));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("zero_optimization.zenflow (ZenFlow) is not supported yet"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("rank"), std::string::npos) << r.err;
}

// --lm_loss: the logits then cross_entropy, chunked_cross_entropy, or the head fused into the
// loss (linear_cross_entropy) on 2 ranks. In fp32, where all three take the softmax in fp32, they
// train alike: the same losses and gradient norms step by step; the fused one without the
// [256 tokens, 50257] logits, ~140 MB less peak RSS per rank. In bf16 the GPT's cross_entropy
// works in bf16 (its loss is a bf16 number), the other two in fp32, and agree with each other.
// A pipeline takes the chunked form and refuses the fused one.
TEST(TrainGptE2E, LmLossFormsTrainAlike) {
  testing::TempDir dir;
  auto config = [](const std::string& precision) {
    return R"({"train_micro_batch_size_per_gpu": 8, "steps_per_print": 100,
      "gradient_clipping": 1.0, "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
      "zero_optimization": {"stage": 1})" + precision + "}";
  };
  std::map<std::string, std::vector<nlohmann::json>> rows;
  for (const std::string precision : {"", R"(, "bf16": {"enabled": true})"}) {
    for (const std::string form : {"cross_entropy", "chunked", "fused"}) {
      const std::string name = form + (precision.empty() ? "" : "_bf16");
      auto r = run_command(launch(dir, config(precision), 4, name + ".jsonl",
                                  "--val_fraction 0.3 --lm_loss " + form));
      ASSERT_EQ(r.exit_code, 0) << name << r.out << r.err;
      rows[name] = read_rows(dir.file(name + ".jsonl"));
      ASSERT_EQ(rows[name].size(), 4u) << name;
    }
  }
  auto expect_alike = [&](const std::string& got, const std::string& want, double tol) {
    for (size_t i = 0; i < 4; ++i) {
      for (const char* key : {"loss", "grad_norm"}) {
        const double w = rows[want][i][key].get<double>();
        EXPECT_NEAR(rows[got][i][key].get<double>(), w, tol * w)
            << got << " vs " << want << " step " << i + 1 << " " << key;
      }
    }
  };
  expect_alike("chunked", "cross_entropy", 1e-5);
  expect_alike("fused", "cross_entropy", 1e-5);
  for (size_t rank = 0; rank < 2; ++rank) {
    EXPECT_LT(rows["fused"][3]["peak_rss_bytes"][rank].get<double>(),
              rows["cross_entropy"][3]["peak_rss_bytes"][rank].get<double>() - 64e6)
        << "rank " << rank;
  }
  expect_alike("fused_bf16", "chunked_bf16", 5e-3);  // bf16 GEMMs blocked differently
  EXPECT_GT(std::abs(rows["chunked_bf16"][0]["loss"].get<double>() -
                     rows["cross_entropy_bf16"][0]["loss"].get<double>()),
            1e-3)
      << "bf16: chunked_cross_entropy's fp32 loss against cross_entropy's bf16 one";
  // A pipeline's last stage takes the chunked loss from its head layer's logits.
  for (const std::string form : {"cross_entropy", "chunked"}) {
    auto r = run_command(launch(dir, config(""), 3, "pipe_" + form + ".jsonl",
                                "--val_fraction 0.3 --pipeline_parallel_size 2 --lm_loss " + form,
                                2));
    ASSERT_EQ(r.exit_code, 0) << form << r.out << r.err;
    rows["pipe_" + form] = read_rows(dir.file("pipe_" + form + ".jsonl"));
    ASSERT_EQ(rows["pipe_" + form].size(), 3u) << form;
  }
  for (size_t i = 0; i < 3; ++i) {
    const double want = rows["pipe_cross_entropy"][i]["loss"].get<double>();
    EXPECT_NEAR(rows["pipe_chunked"][i]["loss"].get<double>(), want, 1e-5 * want) << i + 1;
  }
  auto fused_pipe = run_command(launch(dir, config(""), 1, "pipe.jsonl",
                                       "--lm_loss fused --pipeline_parallel_size 2", 2));
  EXPECT_NE(fused_pipe.exit_code, 0);
  EXPECT_NE(fused_pipe.err.find("--lm_loss fused: the pipeline's head is its own stage layer"),
            std::string::npos)
      << fused_pipe.err;
  auto bad = run_command(std::string(DS_TRAIN_GPT_BIN) + " --lm_loss softmax");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE((bad.out + bad.err).find("--lm_loss must be cross_entropy, chunked or fused, got "
                                     "\"softmax\""),
            std::string::npos)
      << bad.out << bad.err;
}

// A count that must be positive says so, rather than CLI11's "not in range 0.000000 to ...".
TEST(TrainGptE2E, ZeroStepsIsRefusedWithTheFlagAndTheBound) {
  auto r = run_command(std::string(DS_TRAIN_GPT_BIN) + " --steps 0");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE((r.out + r.err).find("--steps: must be at least 1, got 0"), std::string::npos)
      << r.out << r.err;
}

}  // namespace
}  // namespace deepspeed

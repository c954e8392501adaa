// `deepspeed --autotuning` on train_gpt over 2 ranks under an imposed memory budget
// (DS_MEMORY_BUDGET_BYTES) that ZeRO-0 and ZeRO-1 do not fit: the tuner finishes, records
// what ran out of memory instead of crashing, writes the summary and the optimal config; what it
// pruned really does not fit and what it kept really does (checked by running them); the optimal
// config measured again is at least as fast as the user's starting one; `--autotuning run`
// trains with the chosen config; bad autotuning keys are errors naming the key.
//
// The model: 2 layers of width 256 on the fixture's compact vocabulary, Ψ ≈ 2.4M parameters, so
// that the stages' model states (16Ψ, 14Ψ+, 10Ψ+, 8Ψ+ bytes by the formula) differ by more than
// the run-to-run noise of the process's other memory.
#include <unistd.h>

#include <algorithm>
#include <set>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed {
namespace {

using nlohmann::json;
using testing::run_command;

constexpr int64_t kBudget = DS_AUTOTUNING_TEST_BUDGET_MB * int64_t{1} << 20;
constexpr const char* kModel = " --n_layer 2 --n_head 4 --n_embd 256 --seq_len 32 --compact_vocab --eval_batches 0";

int port_base() { return 31000 + (::getpid() % 500) * 4; }

std::string train_gpt(const testing::TempDir& dir, const std::string& config_path, int steps) {
  return std::string(DS_TRAIN_GPT_BIN) + " --deepspeed_config " + config_path + " --data " + dir.file("corpus.txt") +
         " --steps " + std::to_string(steps) + kModel + " --metrics_file " + dir.file("metrics.jsonl");
}

std::string launcher(int port, const std::string& extra = "") {
  return "OMP_NUM_THREADS=1 DS_AUTOTUNING_EXPERIMENT_TIMEOUT_S=120 DS_MEMORY_BUDGET_BYTES=" + std::to_string(kBudget) + " " + DS_LAUNCHER_BIN +
         " --num_gpus 2 --master_port " + std::to_string(port) + " " + extra + " ";
}

json user_config(const testing::TempDir& dir, const json& autotuning_extra = json::object()) {
  json a = {{"enabled", true},
            {"start_profile_step", 1},
            {"end_profile_step", 3},
            {"max_train_micro_batch_size_per_gpu", 8},
            {"num_tuning_micro_batch_sizes", 2},
            {"results_dir", dir.file("results")},
            {"exps_dir", dir.file("exps")}};
  a.update(autotuning_extra);
  return {{"train_micro_batch_size_per_gpu", 1},
          {"steps_per_print", 1000},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
          {"zero_optimization", {{"stage", "all"}}},
          {"autotuning", a}};
}

void setup(const testing::TempDir& dir, const json& config) {
  std::ifstream src(DS_FIXTURE_TEXT);
  std::ofstream(dir.file("corpus.txt")) << src.rdbuf();
  testing::write_text_file(dir.file("ds_config.json"), config.dump(2));
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return json::parse(in);
}

// Runs `config` as one experiment would (the engine measures steps 1..3 and exits); returns the
// metric file, or null when the job failed (then *err holds its output).
json measure(const testing::TempDir& dir, json config, int port, std::string* err = nullptr) {
  config["autotuning"] = {{"enabled", true}, {"start_profile_step", 1}, {"end_profile_step", 3},
                          {"metric_path", dir.file("m.json")}};
  testing::write_text_file(dir.file("measure.json"), config.dump());
  std::filesystem::remove(dir.file("m.json"));
  auto r = run_command(launcher(port) + train_gpt(dir, dir.file("measure.json"), 20));
  if (r.exit_code != 0) {
    if (err) *err = r.out + r.err;
    return nullptr;
  }
  return read_json(dir.file("m.json"));
}

double median_throughput(const testing::TempDir& dir, const json& config, int port, int runs) {
  std::vector<double> v;
  for (int i = 0; i < runs; ++i) {
    json m = measure(dir, config, port + i);
    EXPECT_FALSE(m.is_null()) << config.dump();
    if (!m.is_null()) v.push_back(m["throughput"].get<double>());
  }
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

TEST(AutotuningE2E, TunesWithinTheBudgetPrunesCorrectlyAndBeatsTheStart) {
  testing::TempDir dir("ds_autotune");
  setup(dir, user_config(dir));
  const int port = port_base();
  auto r = run_command(launcher(port, "--autotuning tune") + train_gpt(dir, dir.file("ds_config.json"), 50));
  const std::string all = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << all;
  // Progress lines: experiment i of ~n, best so far, ETA.
  EXPECT_NE(all.find("autotuning: experiment 2 of ~"), std::string::npos) << all;
  EXPECT_NE(all.find("| best so far z"), std::string::npos) << all;
  EXPECT_NE(all.find(", ETA "), std::string::npos) << all;
  // The results.
  const std::string summary_text = [&] {
    std::ifstream in(dir.file("results/summary.txt"));
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  EXPECT_NE(summary_text.find("| tuning_space"), std::string::npos) << summary_text;
  EXPECT_NE(summary_text.find("| global"), std::string::npos) << summary_text;
  const json optimal = read_json(dir.file("results/ds_config_optimal.json"));
  EXPECT_FALSE(optimal.contains("autotuning")) << optimal;
  std::ifstream cmd(dir.file("results/cmd_optimal.txt"));
  std::string cmd_line;
  std::getline(cmd, cmd_line);
  EXPECT_NE(cmd_line.find("--deepspeed_config " + dir.file("results/ds_config_optimal.json")), std::string::npos)
      << cmd_line;
  EXPECT_EQ(cmd_line.find("--autotuning"), std::string::npos) << cmd_line;

  const json results = read_json(dir.file("results/autotuning_results.json"));
  std::vector<json> pruned, ran_ok, out_of_memory;
  for (const json& e : results["experiments"]) {
    const std::string status = e["status"];
    EXPECT_TRUE(status == "ok" || status == "pruned" || status == "out of memory") << e.dump();
    EXPECT_TRUE(std::filesystem::exists(dir.file("exps/" + e["name"].get<std::string>() + "/ds_config.json")) ||
                status == "pruned")
        << e["name"];
    if (status == "pruned") pruned.push_back(e);
    if (status == "ok" && e["tuning_space"] != "model_info") ran_ok.push_back(e);
    if (status == "out of memory") out_of_memory.push_back(e);
  }
  // ZeRO-0 and ZeRO-1 need more than the budget by the formula; ZeRO-2 fits.
  std::set<int> pruned_stages, ok_stages;
  for (const json& e : pruned) pruned_stages.insert(e["ds_config"]["zero_optimization"]["stage"].get<int>());
  for (const json& e : ran_ok) ok_stages.insert(e["ds_config"]["zero_optimization"]["stage"].get<int>());
  EXPECT_TRUE(pruned_stages.count(0) && pruned_stages.count(1)) << summary_text;
  EXPECT_TRUE(ok_stages.count(2)) << summary_text;
  ASSERT_FALSE(pruned.empty()) << summary_text;
  // Every kept experiment that ran fit: its measured peak is within the budget.
  for (const json& e : ran_ok) {
    EXPECT_LE(e["metrics"]["peak_memory_bytes"].get<int64_t>(), kBudget) << e["name"];
  }
  // A pruned configuration would not have fit: run one (the smallest micro-batch of ZeRO-0).
  std::string oom_text;
  EXPECT_TRUE(measure(dir, pruned.front()["ds_config"], port + 100, &oom_text).is_null())
      << pruned.front()["name"] << " ran within the budget";
  EXPECT_NE(oom_text.find("out of memory"), std::string::npos) << oom_text;
  std::printf("%s\n", summary_text.c_str());

  // The optimal config against the user's starting one (the user's micro-batch 1 at the
  // lowest-memory stage, the one the user's config can start from under this budget), measured
  // again, medians of 3 runs each; 10% allowed for a shared 2-core machine.
  json start = results["experiments"][0]["ds_config"];  // the model-information run's config
  start["zero_optimization"]["stage"] = 3;
  start["train_micro_batch_size_per_gpu"] = 1;
  start["gradient_accumulation_steps"] = 1;
  start["train_batch_size"] = 2;
  const double t_start = median_throughput(dir, start, port + 110, 3);
  const double t_optimal = median_throughput(dir, optimal, port + 120, 3);
  std::printf("throughput: start %.2f samples/s, optimal %.2f samples/s (%s)\n", t_start, t_optimal,
              results["best"].get<std::string>().c_str());
  EXPECT_GE(t_optimal, 0.9 * t_start);
}

TEST(AutotuningE2E, RunTrainsWithTheChosenConfig) {
  testing::TempDir dir("ds_autotune_run");
  json config = user_config(dir, {{"max_train_micro_batch_size_per_gpu", 2}, {"num_tuning_micro_batch_sizes", 1}});
  config["zero_optimization"]["stage"] = 2;
  setup(dir, config);
  auto r = run_command(launcher(port_base() + 200, "--autotuning run") + train_gpt(dir, dir.file("ds_config.json"), 6));
  const std::string all = r.out + r.err;
  ASSERT_EQ(r.exit_code, 0) << all;
  EXPECT_NE(all.find("running with the optimal configuration"), std::string::npos) << all;
  const json optimal = read_json(dir.file("results/ds_config_optimal.json"));
  // The last job trained every step with the optimal batch (experiments stop at step 4).
  std::ifstream metrics(dir.file("metrics.jsonl"));
  std::string line, last;
  int rows = 0;
  while (std::getline(metrics, line)) {
    ++rows;
    last = line;
  }
  ASSERT_EQ(rows, 6) << all;
  EXPECT_EQ(json::parse(last)["samples"].get<int64_t>(), 6 * optimal["train_batch_size"].get<int64_t>()) << last;
}

TEST(AutotuningE2E, BadAutotuningKeysAreErrorsNamingTheKey) {
  testing::TempDir dir("ds_autotune_bad");
  json config = user_config(dir, {{"fats", false}});
  setup(dir, config);
  auto r = run_command(launcher(port_base() + 300, "--autotuning tune") + train_gpt(dir, dir.file("ds_config.json"), 6));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("autotuning.fats is not a known key; did you mean 'fast'?"), std::string::npos) << r.err;
  // The engine refuses it too when the job runs on its own.
  auto job = run_command(launcher(port_base() + 301) + train_gpt(dir, dir.file("ds_config.json"), 2));
  EXPECT_NE(job.exit_code, 0);
  EXPECT_NE((job.out + job.err).find("autotuning.fats is not a known key"), std::string::npos) << job.out << job.err;
  config = user_config(dir, {{"metric", "speed"}});
  setup(dir, config);
  r = run_command(launcher(port_base() + 302, "--autotuning tune") + train_gpt(dir, dir.file("ds_config.json"), 6));
  EXPECT_NE(r.err.find("autotuning.metric is \"speed\"; expected one of throughput, latency, flops"), std::string::npos)
      << r.err;
  r = run_command(launcher(port_base() + 303, "--autotuning search") + train_gpt(dir, dir.file("ds_config.json"), 6));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--autotuning"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace deepspeed

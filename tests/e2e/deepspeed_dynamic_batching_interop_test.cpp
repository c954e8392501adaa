// data_efficiency.data_sampling.dynamic_batching against Python DeepSpeed 0.19.8
// (.venv-deepspeed-torch2; 0.15.4 predates dynamic batching), through
// tests/e2e/deepspeed_dynamic_batching_interop.py:
// - batch_by_seqlens packs 400 samples into the same micro-batches, batch sizes and longest
//   sequences as DeepSpeed's, in every picking order (its "random" shuffle included), with
//   minimum and maximum sizes, pipelines' equal-size micro-batches, a subset of the samples and
//   samples too long to fit;
// - an engine under dynamic batching trains each update with the rate DeepSpeed's
//   VariableBatchSizeLR gives it over the same WarmupLR (linear scaling), and over a constant
//   rate (sqrt scaling).
#include "deepspeed/variable_batch.h"

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/deepspeed.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed::data_sampling {
namespace {

constexpr int64_t kSamples = 400;
constexpr int kSteps = 12;

std::vector<int64_t> lengths() {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < kSamples; ++i) out.push_back((i * 7919) % 59 + 1);
  return out;
}

struct Packing {
  BatchBySeqlensOptions options;
  std::vector<int64_t> ids;  // empty: all samples
};

// DeepSpeed's keyword arguments for `p`.
json as_kwargs(const Packing& p) {
  const BatchBySeqlensOptions& o = p.options;
  json k = {{"max_tokens", o.max_tokens},
            {"min_batch_size", o.min_batch_size},
            {"max_batch_size", o.max_batch_size ? json(*o.max_batch_size) : json()},
            {"sequence_picking_order", o.sequence_picking_order},
            {"effective_batch_size", o.effective_batch_size},
            {"required_microbatches_of_same_size", o.required_microbatches_of_same_size},
            {"seed", o.seed ? json(*o.seed) : json()}};
  if (!p.ids.empty()) k["sequence_ids_per_mb"] = p.ids;
  return k;
}

std::vector<Packing> packings() {
  std::vector<Packing> out;
  auto add = [&](int64_t max_tokens, const char* order, int64_t per_batch) -> Packing& {
    Packing p;
    p.options.max_tokens = max_tokens;
    p.options.sequence_picking_order = order;
    p.options.effective_batch_size = per_batch;
    out.push_back(p);
    return out.back();
  };
  add(100, "dataloader", 4);
  Packing& bounded = add(100, "seqlen", 4);
  bounded.options.min_batch_size = 2;
  bounded.options.max_batch_size = 5;
  add(128, "random", 8).options.seed = 1234;
  Packing& pipeline = add(100, "random", 4);
  pipeline.options.seed = 99;
  pipeline.options.required_microbatches_of_same_size = true;
  Packing& subset = add(64, "dataloader", 2);
  for (int64_t i = 0; i < kSamples; i += 3) subset.ids.push_back(i);
  add(50, "seqlen", 2);  // lengths 51..59 do not fit alone
  return out;
}

json engine_config(bool warmup, const std::string& method) {
  json c = {{"train_micro_batch_size_per_gpu", 1},
            {"gradient_accumulation_steps", 4},
            {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.01}}}}},
            {"data_efficiency",
             {{"enabled", true},
              {"data_sampling",
               {{"enabled", true},
                {"dynamic_batching",
                 {{"enabled", true}, {"max_tokens", 100}, {"lr_scaling_method", method}}}}}}}};
  if (warmup) {
    c["scheduler"] = {{"type", "WarmupLR"},
                      {"params",
                       {{"warmup_min_lr", 0.001},
                        {"warmup_max_lr", 0.01},
                        {"warmup_num_steps", 5}}}};
  }
  return c;
}

// The rate each of kSteps updates trains with, and the batch sizes behind them.
std::pair<std::vector<double>, std::vector<int64_t>> our_rates(bool warmup,
                                                               const std::string& method) {
  auto engine =
      initialize(std::make_shared<testing::TinyNetImpl>(), engine_config(warmup, method)).engine;
  auto loader = make_variable_batch_loader(*engine, lengths());
  std::vector<double> used;
  for (int n = 0; n < kSteps; ++n) {
    used.push_back(engine->optimizer()->param_groups()[0].options().get_lr());
    engine->lr_scheduler()->step();  // as the engine does after each optimizer step
  }
  return {used, loader->batches().batch_sizes};
}

TEST(DeepSpeedDynamicBatchingInterop, PackingAndRatesEqualDeepSpeeds) {
  testing::TempDir dir;
  const auto seqlens = lengths();
  const auto cases = packings();
  json packing_cases = json::array();
  for (const auto& p : cases) {
    packing_cases.push_back({{"seqlens", seqlens}, {"options", as_kwargs(p)}});
  }
  const auto [warm_rates, warm_sizes] = our_rates(true, "linear");
  const auto [flat_rates, flat_sizes] = our_rates(false, "sqrt");
  const json rate_cases = json::array(
      {{{"lr", 0.01},
        {"warmup", {{"warmup_min_lr", 0.001}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 5}}},
        {"base_batch_size", 4},
        {"batch_sizes", warm_sizes},
        {"method", "linear"},
        {"steps", kSteps}},
       {{"lr", 0.01},
        {"warmup", nullptr},
        {"base_batch_size", 4},
        {"batch_sizes", flat_sizes},
        {"method", "sqrt"},
        {"steps", kSteps}}});
  std::ofstream(dir.file("cases.json")) << json{{"packings", packing_cases}, {"rates", rate_cases}};

  const auto run = testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                        DS_DEEPSPEED_PYTHON + " " + DS_INTEROP_SCRIPT + " " +
                                        dir.path());
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  std::ifstream in(dir.file("deepspeed.json"));
  const json theirs = json::parse(in);

  ASSERT_EQ(theirs.at("packings").size(), cases.size());
  for (size_t c = 0; c < cases.size(); ++c) {
    const Packing& p = cases[c];
    const VariableBatches ours =
        batch_by_seqlens(seqlens, p.options, p.ids.empty() ? nullptr : &p.ids);
    const json& want = theirs.at("packings")[c];
    using MicroBatches = std::vector<std::pair<int64_t, std::vector<int64_t>>>;
    EXPECT_EQ(ours.microbatch_ids, want.at("microbatch_ids").get<MicroBatches>()) << "case " << c;
    EXPECT_EQ(ours.batch_sizes, want.at("batch_sizes").get<std::vector<int64_t>>()) << "case " << c;
    EXPECT_EQ(ours.batch_max_seqlens, want.at("batch_max_seqlens").get<std::vector<int64_t>>())
        << "case " << c;
    EXPECT_GE(ours.batch_sizes.size(), 10u) << "case " << c;
  }

  const std::vector<std::vector<double>> ours = {warm_rates, flat_rates};
  for (size_t c = 0; c < ours.size(); ++c) {
    const auto want = theirs.at("rates")[c].get<std::vector<double>>();
    ASSERT_EQ(want.size(), ours[c].size());
    for (size_t n = 0; n < want.size(); ++n) {
      EXPECT_NEAR(ours[c][n], want[n], 1e-12) << "rate case " << c << ", update " << n;
    }
  }
}

}  // namespace
}  // namespace deepspeed::data_sampling

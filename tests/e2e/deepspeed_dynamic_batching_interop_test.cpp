// data_efficiency.data_sampling.dynamic_batching against Python DeepSpeed 0.19.8
// (.venv-deepspeed-torch2; 0.15.4 predates dynamic batching), through
// tests/e2e/deepspeed_dynamic_batching_interop.py:
// - batch_by_seqlens packs 400 samples into the same micro-batches, batch sizes and longest
//   sequences as DeepSpeed's, in every picking order (its "random" shuffle included), with
//   minimum and maximum sizes, pipelines' equal-size micro-batches, a subset of the samples and
//   samples too long to fit;
// - an engine under dynamic batching trains each update with the rate DeepSpeed's
//   VariableBatchSizeLR gives it over the same WarmupLR (linear scaling), and over a constant
//   rate (sqrt scaling);
// - the scheduler's checkpoint state crosses both ways: DeepSpeed's VariableBatchSizeLR loads
//   ours and steps on to our next rate, and ours loads DeepSpeed's at DeepSpeed's rate.
#include "deepspeed/variable_batch.h"

#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "deepspeed/deepspeed.h"
#include "runtime/data_efficiency/variable_batch_lr.h"
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

constexpr int kSaveAt = 5;  // the checkpoint: after this many updates

double lr_of(Engine& engine) { return engine.optimizer()->param_groups()[0].options().get_lr(); }

struct OurRates {
  std::vector<double> used;          // the rate each of kSteps updates trains with
  std::vector<int64_t> batch_sizes;  // the batches behind them
  json state;                        // the scheduler's checkpoint state after kSaveAt updates
};

OurRates our_rates(bool warmup, const std::string& method) {
  auto engine =
      initialize(std::make_shared<testing::TinyNetImpl>(), engine_config(warmup, method)).engine;
  auto loader = make_variable_batch_loader(*engine, lengths());
  OurRates out;
  for (int n = 0; n < kSteps; ++n) {
    if (n == kSaveAt) {
      out.state = variable_batch_lr_state_dict(*engine_variable_batch_lr(*engine),
                                               *engine->lr_scheduler());
    }
    out.used.push_back(lr_of(*engine));
    engine->lr_scheduler()->step();  // as the engine does after each optimizer step
  }
  out.batch_sizes = loader->batches().batch_sizes;
  return out;
}

TEST(DeepSpeedDynamicBatchingInterop, PackingAndRatesEqualDeepSpeeds) {
  testing::TempDir dir;
  const auto seqlens = lengths();
  const auto cases = packings();
  json packing_cases = json::array();
  for (const auto& p : cases) {
    packing_cases.push_back({{"seqlens", seqlens}, {"options", as_kwargs(p)}});
  }
  const OurRates warm = our_rates(true, "linear");
  const OurRates flat = our_rates(false, "sqrt");
  const json warmup = {{"warmup_min_lr", 0.001}, {"warmup_max_lr", 0.01}, {"warmup_num_steps", 5}};
  const json rate_cases = json::array({{{"lr", 0.01},
                                        {"warmup", warmup},
                                        {"base_batch_size", 4},
                                        {"batch_sizes", warm.batch_sizes},
                                        {"method", "linear"},
                                        {"steps", kSteps},
                                        {"save_at", kSaveAt}},
                                       {{"lr", 0.01},
                                        {"warmup", nullptr},
                                        {"base_batch_size", 4},
                                        {"batch_sizes", flat.batch_sizes},
                                        {"method", "sqrt"},
                                        {"steps", kSteps},
                                        {"save_at", kSaveAt}}});
  json resume_cases = rate_cases;
  resume_cases[0]["state"] = warm.state;
  resume_cases[1]["state"] = flat.state;
  std::ofstream(dir.file("cases.json"))
      << json{{"packings", packing_cases}, {"rates", rate_cases}, {"resumes", resume_cases}};

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

  const std::vector<OurRates> ours = {warm, flat};
  for (size_t c = 0; c < ours.size(); ++c) {
    const auto want = theirs.at("rates")[c].get<std::vector<double>>();
    ASSERT_EQ(want.size(), ours[c].used.size());
    for (size_t n = 0; n < want.size(); ++n) {
      EXPECT_NEAR(ours[c].used[n], want[n], 1e-12) << "rate case " << c << ", update " << n;
    }
    // DeepSpeed resumed from our state: one step on, the rate of our update kSaveAt + 1.
    EXPECT_NEAR(theirs.at("resumed")[c].get<double>(), ours[c].used[kSaveAt + 1], 1e-12)
        << "rate case " << c;
    // Ours resumed from DeepSpeed's state: the rate of update kSaveAt at once.
    const json state = theirs.at("states")[c];
    auto engine = initialize(std::make_shared<testing::TinyNetImpl>(),
                             engine_config(c == 0, c == 0 ? "linear" : "sqrt"))
                      .engine;
    auto loader = make_variable_batch_loader(*engine, lengths());
    engine->lr_scheduler()->load_state_dict(scheduler_state_from_variable_batch(state, "test"));
    EXPECT_NEAR(lr_of(*engine), ours[c].used[kSaveAt], 1e-12) << "rate case " << c;
    EXPECT_EQ(state.at("batch_sizes"), ours[c].state.at("batch_sizes"));
    EXPECT_EQ(state.at("last_epoch"), ours[c].state.at("last_epoch"));
  }
}

}  // namespace
}  // namespace deepspeed::data_sampling

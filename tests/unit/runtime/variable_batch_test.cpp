// data_efficiency.data_sampling.dynamic_batching: the packing (equal to DeepSpeed 0.19.8's
// batch_by_seqlens on the cases below, which its own function produced), Python's shuffle, the
// loader's dealing over ranks, the config section and the engine's learning rate scaled per
// batch (with resume).
#include "deepspeed/variable_batch.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/deepspeed.h"
#include "deepspeed/indexed_dataset.h"
#include "util/python_random.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed::data_sampling {
namespace {

using MicroBatches = std::vector<std::pair<int64_t, std::vector<int64_t>>>;

std::vector<int64_t> lengths(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < n; ++i) out.push_back((i * 37) % 23 + 5);
  return out;
}

TEST(PythonRandom, ShufflesAsRandomRandomSeedShuffle) {
  // x = list(range(20)); random.Random(seed).shuffle(x)   (CPython 3.11)
  const std::vector<std::pair<int64_t, std::vector<int>>> cases = {
      {1234, {19, 13, 4, 9, 16, 7, 6, 8, 17, 18, 5, 12, 15, 11, 10, 1, 2, 0, 3, 14}},
      {(int64_t{1} << 40) + 7,
       {17, 0, 10, 3, 1, 2, 9, 12, 7, 13, 5, 11, 14, 6, 16, 4, 8, 15, 18, 19}},
      {-5, {4, 9, 6, 5, 14, 17, 18, 1, 2, 15, 10, 3, 12, 7, 13, 0, 16, 11, 8, 19}}};
  for (const auto& [seed, want] : cases) {
    std::vector<int> x(20);
    for (int i = 0; i < 20; ++i) x[static_cast<size_t>(i)] = i;
    std::mt19937 gen = util::python_random(seed);
    util::python_shuffle(x, gen);
    EXPECT_EQ(x, want) << "seed " << seed;
  }
}

// seqlens [5, 19, 10, 24, 15, 6, 20, 11, 25, 16, 7, 21], max_tokens 30, effective_batch_size 2,
// seed 1234: DeepSpeed 0.19.8's batch_by_seqlens returned these.
TEST(BatchBySeqlens, EqualsDeepSpeedsPackingInEveryOrder) {
  const auto seqlens = lengths(12);
  BatchBySeqlensOptions o;
  o.max_tokens = 30;
  o.effective_batch_size = 2;
  o.seed = 1234;
  o.max_batch_size = 3;
  struct Case {
    const char* order;
    MicroBatches microbatches;
    std::vector<int64_t> sizes, longest;
  };
  const std::vector<Case> cases = {
      {"dataloader",
       {{0, {0, 1}}, {0, {2}}, {1, {3}}, {1, {4, 5}}, {2, {6}}, {2, {7}}, {3, {8}}, {3, {9, 10}}},
       {3, 3, 2, 3},
       {19, 24, 20, 25}},
      {"seqlen",
       {{0, {0, 5, 10}}, {0, {2, 7}}, {1, {4}}, {1, {9}}, {2, {1}}, {2, {6}}, {3, {11}}, {3, {3}}},
       {5, 2, 2, 2},
       {11, 16, 20, 24}},
      {"random",
       {{0, {2}}, {0, {3}}, {1, {8}}, {1, {4}}, {2, {11}}, {2, {6, 5}}, {3, {9, 10, 0}}, {3, {1}}},
       {2, 2, 3, 4},
       {24, 25, 21, 19}}};
  for (const auto& c : cases) {
    o.sequence_picking_order = c.order;
    const VariableBatches got = batch_by_seqlens(seqlens, o);
    EXPECT_EQ(got.microbatch_ids, c.microbatches) << c.order;
    EXPECT_EQ(got.batch_sizes, c.sizes) << c.order;
    EXPECT_EQ(got.batch_max_seqlens, c.longest) << c.order;
  }
  // Pipelines: the two micro-batches of a batch take the run round-robin, equal in size.
  BatchBySeqlensOptions same;
  same.max_tokens = 30;
  same.effective_batch_size = 2;
  same.required_microbatches_of_same_size = true;
  const VariableBatches got = batch_by_seqlens(seqlens, same);
  EXPECT_EQ(got.microbatch_ids,
            (MicroBatches{{0, {0}}, {0, {1}}, {1, {2, 4}}, {1, {3, 5}}, {2, {6}}, {2, {7}},
                          {3, {8}}, {3, {9}}}));
  EXPECT_EQ(got.batch_sizes, (std::vector<int64_t>{2, 4, 2, 2}));
}

TEST(BatchBySeqlens, LeavesOutLongSamplesAndRefusesBadInput) {
  BatchBySeqlensOptions o;
  o.max_tokens = 10;
  // 30 > max_tokens is left out; DeepSpeed's loop never takes the last sample (5). (DeepSpeed
  // 0.19.8 returned these.)
  const VariableBatches got = batch_by_seqlens({3, 30, 4, 5, 2, 4}, o);
  EXPECT_EQ(got.microbatch_ids, (MicroBatches{{0, {0, 2}}, {1, {3, 4}}}));
  const std::vector<int64_t> only = {3, 4, 5};
  EXPECT_EQ(batch_by_seqlens({3, 30, 4, 5, 2, 4}, o, &only).microbatch_ids,
            (MicroBatches{{0, {3, 4}}}));
  EXPECT_THROW_WITH(batch_by_seqlens({3, -1, 4}, o), UsageError,
                    "sample 1 has a negative length -1");
  o.effective_batch_size = 4;
  EXPECT_THROW_WITH(batch_by_seqlens({3, 4, 5}, o), UsageError,
                    "fewer than one batch of 4 (train_batch_size)");
  o.sequence_picking_order = "longest";
  EXPECT_THROW_WITH(batch_by_seqlens({3, 4, 5}, o), UsageError, "sequence_picking_order");
}

TEST(ScaleLr, LinearSqrtAndNone) {
  EXPECT_DOUBLE_EQ(scale_lr(4, 6, 0.1, "linear"), 0.15);
  EXPECT_DOUBLE_EQ(scale_lr(4, 16, 0.1, "sqrt"), 0.2);
  EXPECT_DOUBLE_EQ(scale_lr(4, 16, 0.1, "none"), 0.1);
  EXPECT_THROW_WITH(scale_lr(4, 16, 0.1, "cubic"), UsageError, "unknown scaling method");
}

// DistributedSampler(shuffle=False) over the micro-batches: rank r takes r, r + R, ...
TEST(VariableBatchLoader, DealsMicroBatchesOverRanksAsDeepSpeedsSampler) {
  BatchBySeqlensOptions o;
  o.max_tokens = 30;
  o.effective_batch_size = 2;
  o.max_batch_size = 3;
  const VariableBatches batches = batch_by_seqlens(lengths(12), o);
  VariableBatchLoader rank1(batches, 1, 1, 2);
  ASSERT_EQ(rank1.size(), 4);
  std::vector<std::vector<int64_t>> got;
  std::vector<int64_t> ids;
  while (auto mb = rank1.next()) {
    got.push_back(mb->samples);
    ids.push_back(mb->batch_id);
    EXPECT_EQ(mb->max_seqlen, batches.batch_max_seqlens[static_cast<size_t>(mb->batch_id)]);
  }
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{2}, {4, 5}, {7}, {9, 10}}));
  EXPECT_EQ(ids, (std::vector<int64_t>{0, 1, 2, 3}));
  rank1.seek(3);
  EXPECT_EQ(rank1.next()->samples, (std::vector<int64_t>{9, 10}));
  EXPECT_FALSE(rank1.next().has_value());
  rank1.reset();
  EXPECT_EQ(rank1.next()->samples, (std::vector<int64_t>{2}));

  // One rank, two micro-batches per micro-step: a step is a whole batch.
  VariableBatchLoader one(batches, 2, 0, 1);
  EXPECT_EQ(one.size(), 4);
  EXPECT_EQ(one.next()->samples, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(one.next()->samples, (std::vector<int64_t>{3, 4, 5}));
}

json dynamic_config(json dynamic, bool scheduler = true) {
  json c = {{"train_micro_batch_size_per_gpu", 1},
            {"gradient_accumulation_steps", 2},
            {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
            {"data_efficiency",
             {{"enabled", true},
              {"seed", 1234},
              {"data_sampling", {{"enabled", true}, {"dynamic_batching", std::move(dynamic)}}}}}};
  if (scheduler) {
    c["scheduler"] = {{"type", "WarmupLR"},
                      {"params",
                       {{"warmup_min_lr", 0.0}, {"warmup_max_lr", 0.1}, {"warmup_num_steps", 5}}}};
  }
  return c;
}

DeepSpeedConfig parse(const json& config) { return DeepSpeedConfig::from_json(config, 1); }

TEST(DynamicBatchingConfig, ReadsDeepSpeedsKeysAndNamesEveryBadOne) {
  const auto d = dynamic_batching_config(parse(dynamic_config(
      {{"enabled", true}, {"max_tokens", 64}, {"lr_scaling_method", "NONE"}})));
  EXPECT_TRUE(d.enabled);
  EXPECT_EQ(d.max_tokens, 64);
  EXPECT_EQ(d.lr_scaling_method, "none");
  EXPECT_EQ(d.sequence_picking_order, "dataloader");
  EXPECT_EQ(d.min_batch_size, 1);
  EXPECT_FALSE(d.max_batch_size.has_value());
  EXPECT_EQ(d.seed, 1234);
  EXPECT_THROW_WITH(parse(dynamic_config({{"enabled", true}})), ConfigError,
                    "data_efficiency.data_sampling.dynamic_batching.max_tokens");
  EXPECT_THROW_WITH(
      parse(dynamic_config({{"enabled", true}, {"max_tokens", 8}, {"lr_scaling_method", "x"}})),
      ConfigError, "dynamic_batching.lr_scaling_method");
  EXPECT_THROW_WITH(parse(dynamic_config(
                        {{"enabled", true}, {"max_tokens", 8}, {"sequence_picking_order", "x"}})),
                    ConfigError, "dynamic_batching.sequence_picking_order");
  EXPECT_THROW_WITH(parse(dynamic_config({{"enabled", true},
                                          {"max_tokens", 8},
                                          {"min_batch_size", 4},
                                          {"max_batch_size", 2}})),
                    ConfigError, "dynamic_batching.max_batch_size");
  const json resolved = parse(dynamic_config({{"enabled", true}, {"max_tokens", 64}})).resolved();
  EXPECT_EQ(resolved["data_efficiency"]["data_sampling"]["dynamic_batching"]["max_tokens"], 64);
}

double lr_of(Engine& engine) { return engine.optimizer()->param_groups()[0].options().get_lr(); }

// DeepSpeed's VariableBatchSizeLR: update n trains with the schedule's value for step n (its
// wrapper steps the base schedule once at construction) times batch n's sequences over
// train_batch_size; after the last batch the sizes start over.
TEST(VariableBatchEngine, ScalesTheLearningRateByEachBatchsSequences) {
  testing::TempDir dir;
  const json config =
      dynamic_config({{"enabled", true}, {"max_tokens", 30}, {"max_batch_size", 3}});
  auto engine = initialize(std::make_shared<testing::TinyNetImpl>(), config).engine;
  auto loader = make_variable_batch_loader(*engine, lengths(12));
  const auto sizes = loader->batches().batch_sizes;
  ASSERT_EQ(sizes, (std::vector<int64_t>{3, 3, 2, 3}));
  const auto schedule = optim::make_lr_schedule(parse(config).scheduler, 1, "test");
  auto expected = [&](int64_t n) {
    return schedule.lr(n, 0, 0.1) * static_cast<double>(sizes[static_cast<size_t>(n % 4)]) / 2.0;
  };
  for (int64_t n = 0; n < 6; ++n) {
    if (n == 4) loader->reset();
    EXPECT_NEAR(lr_of(*engine), expected(n), 1e-12) << "update " << n;
    for (int micro = 0; micro < 2; ++micro) {
      const auto mb = loader->next();
      ASSERT_TRUE(mb.has_value());
      EXPECT_EQ(mb->batch_id, n % 4);
      torch::Tensor x, y;
      for (int64_t s : mb->samples) {
        auto [xs, ys] = testing::tiny_batch(s, 1);
        x = x.defined() ? torch::cat({x, xs}) : xs;
        y = y.defined() ? torch::cat({y, ys}) : ys;
      }
      engine->backward(engine->forward(x, y));
      engine->step();
    }
    if (n == 2) engine->save_checkpoint(dir.path());
  }
  EXPECT_NE(expected(1), expected(2));  // the scaling shows

  // A loader made after load_checkpoint rewrites the resumed rate with the scaling.
  auto resumed = initialize(std::make_shared<testing::TinyNetImpl>(), config).engine;
  resumed->load_checkpoint(dir.path());
  auto again = make_variable_batch_loader(*resumed, lengths(12));
  EXPECT_NEAR(lr_of(*resumed), expected(3), 1e-12);

  // Without a scheduler section the optimizer's constant rate is scaled.
  json constant = config;
  constant.erase("scheduler");
  auto plain = initialize(std::make_shared<testing::TinyNetImpl>(), constant).engine;
  make_variable_batch_loader(*plain, lengths(12));
  EXPECT_NEAR(lr_of(*plain), 0.1 * 3 / 2, 1e-12);
}

TEST(VariableBatchEngine, NeedsTheSectionARescalableSchedulerAndTheLengths) {
  testing::TempDir dir;
  auto off = initialize(std::make_shared<testing::TinyNetImpl>(),
                        dynamic_config({{"enabled", false}})).engine;
  EXPECT_THROW_WITH(make_variable_batch_loader(*off, lengths(12)), UsageError,
                    "dynamic_batching.enabled is false");
  const json config = dynamic_config({{"enabled", true}, {"max_tokens", 30}});
  LRSchedulerFactory factory = [](torch::optim::Optimizer& o) {
    return optim::make_lr_scheduler(parse(dynamic_config({}, true)).scheduler, o, "factory");
  };
  auto with_factory = initialize(std::make_shared<testing::TinyNetImpl>(), parse(config),
                                 nullptr, factory).engine;
  EXPECT_THROW_WITH(make_variable_batch_loader(*with_factory, lengths(12)), UsageError,
                    "LRSchedulerFactory");
  auto engine = initialize(std::make_shared<testing::TinyNetImpl>(), config).engine;
  EXPECT_THROW_WITH(make_variable_batch_loader(*engine), UsageError, "metrics_path is not set");

  // The lengths from DataAnalyzer's "seqlen" metric under metrics_path.
  DataAnalyzer analyzer(12, dir.file("metrics"), 1, 0);
  analyzer.add_metric("seqlen", [](int64_t s) { return (s * 37) % 23 + 5; });
  analyzer.run_map_reduce();
  json with_path = dynamic_config(
      {{"enabled", true}, {"max_tokens", 30}, {"max_batch_size", 3},
       {"metrics_path", dir.file("metrics")}});
  auto from_file = initialize(std::make_shared<testing::TinyNetImpl>(), with_path).engine;
  auto loader = make_variable_batch_loader(*from_file);
  EXPECT_EQ(loader->batches().batch_sizes, (std::vector<int64_t>{3, 3, 2, 3}));
}

}  // namespace
}  // namespace deepspeed::data_sampling

// Random-LTD (data_efficiency.data_routing.random_ltd): the schedule against DeepSpeed's own
// (tests/golden/random_ltd_golden.py printed the expected values from DeepSpeed's sources), the
// token gather/scatter and its gradients, the section's checks, and the engine's part: the
// schedule handed to training forwards, saved in checkpoints and resumed.
#include "deepspeed/deepspeed.h"

#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"
#include "support/token_net.h"

namespace deepspeed {
namespace {

namespace ckpt = checkpoint;

json random_ltd_section(int64_t total, std::vector<int64_t> ids, int64_t lo, int64_t hi,
                        int64_t require_steps, int64_t seq_per_step) {
  return {{"enabled", true},
          {"total_layer_num", total},
          {"random_ltd_layer_num", ids.size()},
          {"random_ltd_layer_id", ids},
          {"model_mask_name", nullptr},
          {"model_type", "decoder"},
          {"hidden_state_order", "batch_seq_dim"},
          {"random_ltd_schedule",
           {{"min_value", lo},
            {"max_value", hi},
            {"schedule_type", "fixed_linear"},
            {"schedule_config", {{"require_steps", require_steps},
                                 {"seq_per_step", seq_per_step}}}}}};
}

// Whether any of the config's warnings mentions `text`.
bool warns(const DeepSpeedConfig& c, const std::string& text) {
  for (const auto& w : c.warnings) {
    if (w.find(text) != std::string::npos) return true;
  }
  return false;
}

json with_random_ltd(json config, const json& section) {
  config["data_efficiency"] = {{"enabled", true},
                               {"data_routing", {{"enabled", true}, {"random_ltd", section}}}};
  return config;
}

DeepSpeedConfig parse(const json& config) { return DeepSpeedConfig::from_json(config, 1); }

RandomLtdConfig ltd_config(int64_t total, int64_t dropping, int64_t lo, int64_t hi,
                           int64_t require_steps, int64_t seq_per_step) {
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < dropping; ++i) ids.push_back(i);
  return parse(with_random_ltd({{"train_batch_size", 4}},
                               random_ltd_section(total, ids, lo, hi, require_steps,
                                                  seq_per_step)))
      .data_efficiency.random_ltd;
}

struct Golden {
  const char* name;
  RandomLtdConfig config;
  int64_t global_batch;
  std::vector<int64_t> steps, seqs, tokens;
  int64_t total_tokens;
};

TEST(RandomLtdScheduler, MatchesDeepSpeed) {
  const std::vector<Golden> cases = {
      {"Linear", ltd_config(4, 2, 16, 128, 10, 16), 8,
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12},
       {16, 16, 32, 48, 48, 64, 80, 80, 96, 112, 128, 128, 128},
       {2304, 4608, 7168, 9984, 12800, 15872, 19200, 22528, 26112, 29952, 34048, 38144, 42240},
       42240},
      // Step 0 rounds 10 down to 0; the floor is 16, the first multiple at or above min_value.
      {"UnalignedMin", ltd_config(6, 3, 10, 100, 7, 16), 4,
       {0, 1, 2, 3, 4, 5, 6, 7, 8, 9},
       {16, 16, 32, 48, 48, 64, 80, 96, 100, 100},
       {1392, 2784, 4368, 6144, 7920, 9888, 12048, 14400, 16800, 19200},
       19200},
      // A step's layer-tokens count once however many forwards it has (gradient accumulation).
      {"RepeatedSteps", ltd_config(3, 1, 8, 32, 4, 8), 2,
       {0, 0, 1, 1, 2, 3, 3, 4, 5},
       {8, 8, 8, 8, 16, 24, 24, 32, 32},
       {144, 144, 288, 288, 448, 624, 624, 816, 1008},
       1584},
  };
  for (const auto& c : cases) {
    RandomLtdScheduler scheduler(c.config, c.global_batch);
    EXPECT_EQ(scheduler.get_current_seq(), c.config.min_value) << c.name;
    std::vector<int64_t> seqs, tokens;
    for (int64_t t : c.steps) {
      scheduler.update_seq(t);
      seqs.push_back(scheduler.get_current_seq());
      tokens.push_back(scheduler.consumed_layer_tokens());
    }
    EXPECT_EQ(seqs, c.seqs) << c.name;
    EXPECT_EQ(tokens, c.tokens) << c.name;
    const auto before = scheduler.state_dict();
    EXPECT_EQ(scheduler.get_total_layer_tokens(static_cast<int64_t>(c.steps.size())),
              c.total_tokens)
        << c.name;
    EXPECT_EQ(scheduler.state_dict(), before) << c.name << ": get_total_layer_tokens changed it";
  }
}

TEST(RandomLtdScheduler, StateDictRoundTripsAndContinues) {
  RandomLtdScheduler a(ltd_config(4, 2, 16, 128, 10, 16), 8);
  for (int64_t t = 0; t < 4; ++t) a.update_seq(t);
  const json state = a.state_dict();
  EXPECT_EQ(state, (json{{"consumed_layer_tokens", 9984},
                         {"current_steps", 3},
                         {"current_value", 48},
                         {"min_value", 16},
                         {"max_value", 128}}));
  RandomLtdScheduler b(ltd_config(4, 2, 16, 128, 10, 16), 8);
  b.load_state_dict(state, "ckpt.pt");
  for (int64_t t = 4; t < 12; ++t) {
    a.update_seq(t);
    b.update_seq(t);
    EXPECT_EQ(b.state_dict(), a.state_dict()) << "step " << t;
  }
  json broken = state;
  broken.erase("current_value");
  EXPECT_THROW_WITH(b.load_state_dict(broken, "ckpt.pt"), CheckpointError,
                    "ckpt.pt: random_ltd state has no integer 'current_value'");
  EXPECT_EQ(b.state_dict(), a.state_dict()) << "a failed load changed the state";
}

TEST(RandomLtdTokens, SampledPositionsAreSortedDistinctAndCoverTheSequence) {
  torch::manual_seed(3);
  std::vector<int64_t> hits(16, 0);
  for (int draw = 0; draw < 50; ++draw) {
    const auto idx = random_ltd::sample_tokens(5, 16, 3, 2, torch::kCPU);
    ASSERT_EQ(idx.sizes(), (std::vector<int64_t>{2, 3, 5}));
    ASSERT_EQ(idx.scalar_type(), torch::kLong);
    const auto rows = idx.reshape({6, 5});
    for (int64_t r = 0; r < 6; ++r) {
      const auto row = rows[r];
      EXPECT_TRUE((row.slice(0, 1) > row.slice(0, 0, 4)).all().item<bool>()) << row;
      for (int64_t i = 0; i < 5; ++i) ++hits[static_cast<size_t>(row[i].item<int64_t>())];
    }
  }
  // 1500 draws over 16 positions: every position is drawn, none far from its share of 94.
  for (size_t p = 0; p < hits.size(); ++p) {
    EXPECT_GT(hits[p], 50) << "position " << p;
    EXPECT_LT(hits[p], 140) << "position " << p;
  }
  EXPECT_THROW_WITH(random_ltd::sample_tokens(17, 16, 1, 1, torch::kCPU), UsageError,
                    "cannot keep 17 of 16 tokens");
}

// A layer f(t) = 3 t on the kept tokens of [2, 6, 4] hidden states, batch- or sequence-first:
// the kept positions get 3x, the others pass, and the gradients are 3 and 1 likewise.
TEST(RandomLtdTokens, GatherAndScatterGiveTheLayersOutputsAndGradients) {
  const auto idx = torch::tensor({{0, 2, 5}, {1, 3, 4}}, torch::kLong);
  for (bool batch_first : {true, false}) {
    torch::manual_seed(1);
    auto bsh = torch::randn({2, 6, 4});
    auto hidden = (batch_first ? bsh : bsh.transpose(0, 1).contiguous()).requires_grad_(true);
    auto part = random_ltd::gather_tokens(hidden, idx, batch_first);
    ASSERT_EQ(part.size(batch_first ? 1 : 0), 3);
    auto out = random_ltd::scatter_tokens(hidden, part * 3, idx, batch_first);
    auto weights = torch::arange(out.numel(), torch::kFloat).view(out.sizes());
    (out * weights).sum().backward();
    auto got = batch_first ? out.detach() : out.detach().transpose(0, 1);
    auto grad = batch_first ? hidden.grad() : hidden.grad().transpose(0, 1);
    auto w = batch_first ? weights : weights.transpose(0, 1);
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t s = 0; s < 6; ++s) {
        const bool kept = (idx[b] == s).any().item<bool>();
        const double factor = kept ? 3.0 : 1.0;
        EXPECT_TRUE(torch::allclose(got[b][s], bsh[b][s] * factor)) << b << "," << s;
        EXPECT_TRUE(torch::allclose(grad[b][s], w[b][s] * factor)) << b << "," << s;
      }
    }
  }
}

TEST(RandomLtdTokens, EncoderMasksKeepTheKeptRowsAndColumns) {
  auto mask = torch::arange(2 * 1 * 5 * 5, torch::kFloat).view({2, 1, 5, 5});
  const auto idx = torch::tensor({{0, 3}, {2, 4}}, torch::kLong);
  const auto got = random_ltd::gather_mask(mask, idx);
  ASSERT_EQ(got.sizes(), (std::vector<int64_t>{2, 1, 2, 2}));
  for (int64_t b = 0; b < 2; ++b) {
    const auto want = mask[b][0].index_select(0, idx[b]).index_select(1, idx[b]);
    EXPECT_TRUE(torch::equal(got[b][0], want)) << b;
  }
}

RandomLtdScheduler scheduler_at(const RandomLtdConfig& config, int64_t step) {
  RandomLtdScheduler s(config, 4);
  s.update_seq(step);
  return s;
}

TEST(RandomLayerTokenDrop, OnlyTheListedLayersDropEachItsOwnTokens) {
  auto config = ltd_config(4, 2, 8, 64, 100, 8);
  config.random_ltd_layer_id = {1, 3};
  const auto scheduler = scheduler_at(config, 0);  // keeps 8 of 64
  torch::manual_seed(0);
  const auto hidden = torch::randn({2, 64, 3});
  const RandomLayerTokenDrop ltd(&scheduler, hidden, /*training=*/true);
  ASSERT_TRUE(ltd.active());
  EXPECT_EQ(ltd.reserved_length(), 8);
  EXPECT_FALSE(ltd.drops(0));
  EXPECT_TRUE(ltd.drops(1));
  EXPECT_FALSE(ltd.drops(2));
  EXPECT_TRUE(ltd.drops(3));
  EXPECT_FALSE(torch::equal(ltd.indices(1), ltd.indices(3)));
  EXPECT_THROW_WITH(ltd.indices(2), UsageError, "layer 2 drops no tokens");
  for (int64_t layer = 0; layer < 4; ++layer) {
    int64_t seen = 0;
    const auto out = ltd.forward(layer, hidden, [&](const torch::Tensor& in) {
      seen = in.size(1);
      return in + 1;
    });
    if (!ltd.drops(layer)) {
      EXPECT_EQ(seen, 64);
      EXPECT_TRUE(torch::equal(out, hidden + 1));
      continue;
    }
    EXPECT_EQ(seen, 8);
    const auto changed = (out != hidden).any(-1);  // [batch, seq]
    for (int64_t b = 0; b < 2; ++b) {
      const auto kept = changed[b].nonzero().flatten();
      EXPECT_TRUE(torch::equal(kept, ltd.indices(layer)[b])) << "layer " << layer;
    }
  }
}

TEST(RandomLayerTokenDrop, DropsNothingOffScheduleOrOutsideTraining) {
  const auto config = ltd_config(2, 2, 8, 32, 4, 8);
  const auto hidden = torch::randn({2, 16, 3});
  auto layer_sees = [&](const RandomLtdScheduler* s, bool training, const torch::Tensor& h) {
    const RandomLayerTokenDrop ltd(s, h, training);
    int64_t seen = 0;
    const auto out = ltd.forward(0, h, [&](const torch::Tensor& in) {
      seen = in.size(1);
      return in * 2;
    });
    EXPECT_TRUE(torch::equal(out, h * 2));
    EXPECT_FALSE(ltd.active());
    return seen;
  };
  EXPECT_EQ(layer_sees(nullptr, true, hidden), 16);
  const auto early = scheduler_at(config, 0);  // keeps 8
  EXPECT_EQ(layer_sees(&early, false, hidden), 16);
  const auto later = scheduler_at(config, 2);  // keeps 16 = the whole sequence
  EXPECT_EQ(later.get_current_seq(), 16);
  EXPECT_EQ(layer_sees(&later, true, hidden), 16);
}

TEST(RandomLayerTokenDrop, MaskedLayersGetTheKeptTokensMask) {
  auto config = ltd_config(1, 1, 3, 6, 100, 1);
  const auto causal = torch::ones({6, 6}).tril().view({1, 1, 6, 6}).expand({2, 1, 6, 6});
  const auto hidden = torch::randn({6, 2, 4});  // seq-first
  for (const char* type : {"decoder", "encoder"}) {
    config.model_type = type;
    config.hidden_state_order = "seq_batch_dim";
    const auto scheduler = scheduler_at(config, 0);
    const RandomLayerTokenDrop ltd(&scheduler, hidden, true);
    torch::Tensor mask_seen;
    const auto out = ltd.forward(0, hidden, causal,
                                 [&](const torch::Tensor& in, const torch::Tensor& mask) {
                                   EXPECT_EQ(in.size(0), 3);
                                   EXPECT_EQ(in.size(1), 2);
                                   mask_seen = mask;
                                   return in;
                                 });
    EXPECT_TRUE(torch::equal(out, hidden));
    // A causal mask over kept tokens in order is the causal mask of their count, which is what
    // a decoder's cut gives; an encoder's gather gives the same here.
    const auto want = torch::ones({3, 3}).tril().view({1, 1, 3, 3}).expand({2, 1, 3, 3});
    EXPECT_TRUE(torch::equal(mask_seen, want)) << type;
  }
}

// ---------------------------------------------------------------------------------------------
// The section

TEST(RandomLtdConfig, ReadsDeepSpeedsSection) {
  const auto c = parse(with_random_ltd({{"train_batch_size", 4}},
                                       random_ltd_section(6, {4, 1, 2}, 16, 64, 100, 16)));
  const auto& r = c.data_efficiency.random_ltd;
  EXPECT_TRUE(r.enabled);
  EXPECT_EQ(r.random_ltd_layer_id, (std::vector<int64_t>{1, 2, 4}));  // sorted, as DeepSpeed
  EXPECT_FALSE(r.model_mask_name.has_value());
  EXPECT_EQ(r.require_steps, 100);
  EXPECT_FALSE(warns(c, "data_efficiency"));
  EXPECT_EQ(c.resolved()["data_efficiency"]["data_routing"]["random_ltd"]["random_ltd_layer_id"],
            json({1, 2, 4}));
  EXPECT_NO_THROW(c.check_supported());
  // A switched-off section's keys are never read, whatever they hold (as DeepSpeed).
  const auto off = parse({{"train_batch_size", 4},
                          {"data_efficiency",
                           {{"data_routing", {{"random_ltd", {{"enabled", false},
                                                               {"total_layer_num", "x"}}}}}}}});
  EXPECT_FALSE(off.data_efficiency.random_ltd.enabled);
  EXPECT_FALSE(warns(off, "data_efficiency"));
}

TEST(RandomLtdConfig, BadSectionsAreNamed) {
  const json base = {{"train_batch_size", 4}};
  const std::string path = "data_efficiency.data_routing.random_ltd";
  auto fails = [&](json section, const std::string& message) {
    EXPECT_THROW_WITH(parse(with_random_ltd(base, section)), ConfigError, message);
  };
  json s = random_ltd_section(4, {0, 1}, 8, 32, 10, 8);
  s["random_ltd_layer_num"] = 3;
  fails(s, path + ".random_ltd_layer_num is 3; it must equal the length of "
                  "random_ltd_layer_id (2)");
  s = random_ltd_section(4, {0, 4}, 8, 32, 10, 8);
  fails(s, path + ".random_ltd_layer_id names layer 4; total_layer_num is 4");
  s = random_ltd_section(4, {1, 1}, 8, 32, 10, 8);
  fails(s, path + ".random_ltd_layer_id names a layer twice");
  s = random_ltd_section(4, {0}, 8, 32, 10, 8);
  s.erase("hidden_state_order");
  fails(s, path + ".hidden_state_order is required when random_ltd is enabled");
  s = random_ltd_section(4, {0}, 8, 32, 10, 8);
  s["model_type"] = "seq2seq";
  fails(s, path + ".model_type is \"seq2seq\"; expected \"decoder\" or \"encoder\"");
  s = random_ltd_section(4, {0}, 8, 32, 10, 8);
  s["random_ltd_schedule"]["schedule_type"] = "fixed_root";
  fails(s, path + ".random_ltd_schedule.schedule_type is \"fixed_root\"; expected "
                  "\"fixed_linear\"");
  s = random_ltd_section(4, {0}, 64, 32, 10, 8);
  fails(s, path + ".random_ltd_schedule.max_value is 32, below min_value 64");
  s = random_ltd_section(4, {0}, 8, 32, 10, 8);
  s["random_ltd_schedule"]["schedule_config"].erase("seq_per_step");
  fails(s, path + ".random_ltd_schedule.schedule_config.seq_per_step is required");
}

TEST(RandomLtdConfig, WhatThisBuildLacksIsRefusedByName) {
  json s = random_ltd_section(4, {0}, 8, 32, 10, 8);
  s["layer_token_lr_schedule"] = {{"enabled", true}, {"total_layer_tokens", 1000}};
  EXPECT_THROW_WITH(parse(with_random_ltd({{"train_batch_size", 4}}, s)).check_supported(),
                    NotSupportedError,
                    "data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.enabled");
  // DeepSpeed turns random-LTD on by random_ltd.enabled alone; so does this build, and says so.
  json config = with_random_ltd({{"train_batch_size", 4}}, random_ltd_section(4, {0}, 8, 32, 1, 8));
  config["data_efficiency"]["enabled"] = false;
  const auto c = parse(config);
  EXPECT_TRUE(c.data_efficiency.random_ltd.enabled);
  EXPECT_TRUE(warns(c, "data_efficiency.data_routing.random_ltd.enabled is true while "
                       "data_efficiency.enabled is false"));
}

// ---------------------------------------------------------------------------------------------
// The engine

constexpr int64_t kSeq = 16, kWidth = 4;

json token_engine_config() {
  return with_random_ltd({{"train_micro_batch_size_per_gpu", 2},
                          {"gradient_accumulation_steps", 2},
                          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}},
                         random_ltd_section(3, {0, 2}, 4, kSeq, 4, 4));
}

// Micro-steps first .. first+count-1 of training on fixed data; returns their losses.
template <typename EnginePtr>
std::vector<double> train(const EnginePtr& engine, int count, int first = 0) {
  std::vector<double> losses;
  for (int m = first; m < first + count; ++m) {
    auto [x, y] = testing::token_batch(2 * m, 2, kSeq, kWidth);
    auto loss = engine->forward(x, y);
    engine->backward(loss);
    engine->step();
    losses.push_back(loss.template item<double>());
  }
  return losses;
}

TEST(EngineRandomLtd, LayersKeepTheScheduledTokensAndEvaluationKeepsAll) {
  auto model = std::make_shared<testing::TokenNetImpl>(3, kWidth);
  auto engine = initialize(model, token_engine_config()).engine;
  ASSERT_NE(engine->random_ltd_scheduler(), nullptr);
  std::vector<std::vector<int64_t>> seen;
  for (int m = 0; m < 8; ++m) {
    auto [x, y] = testing::token_batch(2 * m, 2, kSeq, kWidth);
    engine->backward(engine->forward(x, y));
    engine->step();
    seen.push_back(model->seen_tokens);
    EXPECT_EQ(engine->forward_kwargs().random_ltd, engine->random_ltd_scheduler());
  }
  // Global steps 0..3 keep 4, 4, 8, 12 of 16 tokens in layers 0 and 2 (DeepSpeed's schedule,
  // moved at every training forward to global_steps); layer 1 sees all 16.
  const std::vector<int64_t> kept = {4, 4, 4, 4, 8, 8, 12, 12};
  for (size_t m = 0; m < seen.size(); ++m) {
    EXPECT_EQ(seen[m], (std::vector<int64_t>{kept[m], kSeq, kept[m]})) << "micro-step " << m;
  }
  // Train batch 4: 4 * (kept * 2 + 16 * 1) per step, once per step.
  EXPECT_EQ(engine->random_ltd_scheduler()->consumed_layer_tokens(),
            4 * (4 * 2 + 16) + 4 * (4 * 2 + 16) + 4 * (8 * 2 + 16) + 4 * (12 * 2 + 16));
  engine->eval();
  auto [x, y] = testing::token_batch(0, 2, kSeq, kWidth);
  engine->forward(x, y);
  EXPECT_EQ(model->seen_tokens, (std::vector<int64_t>{kSeq, kSeq, kSeq}));
  EXPECT_EQ(engine->forward_kwargs().random_ltd, nullptr);
}

TEST(EngineRandomLtd, CheckpointKeepsTheScheduleAndTheResumedRunDrawsTheSameTokens) {
  testing::TempDir dir;
  torch::manual_seed(11);
  auto model = std::make_shared<testing::TokenNetImpl>(3, kWidth);
  auto engine = initialize(model, token_engine_config()).engine;
  train(engine, 4);
  engine->save_checkpoint(dir.path(), std::string("tag"));
  const json saved_state = engine->random_ltd_scheduler()->state_dict();
  const auto uninterrupted = train(engine, 4, 4);

  const auto states = ckpt::load(dir.file("tag/mp_rank_00_model_states.pt")).toGenericDict();
  EXPECT_EQ(ckpt::json_from_ivalue(states.at("random_ltd"), "random_ltd"), saved_state);

  auto resumed_model = std::make_shared<testing::TokenNetImpl>(3, kWidth, /*seed=*/99);
  auto resumed = initialize(resumed_model, token_engine_config()).engine;
  resumed->load_checkpoint(dir.path(), std::string("tag"));
  EXPECT_EQ(resumed->random_ltd_scheduler()->state_dict(), saved_state);
  EXPECT_EQ(train(resumed, 4, 4), uninterrupted);
  EXPECT_EQ(resumed->random_ltd_scheduler()->state_dict(),
            engine->random_ltd_scheduler()->state_dict());
}

TEST(EngineRandomLtd, ACheckpointWithoutItContinuesTheScheduleFromTheGlobalStep) {
  testing::TempDir dir;
  json plain = token_engine_config();
  plain.erase("data_efficiency");
  auto model = std::make_shared<testing::TokenNetImpl>(3, kWidth);
  auto engine = initialize(model, plain).engine;
  train(engine, 6);  // 3 steps
  engine->save_checkpoint(dir.path(), std::string("tag"));

  auto ltd_model = std::make_shared<testing::TokenNetImpl>(3, kWidth);
  auto with = initialize(ltd_model, token_engine_config()).engine;
  with->load_checkpoint(dir.path(), std::string("tag"));
  train(with, 1, 6);
  EXPECT_EQ(ltd_model->seen_tokens, (std::vector<int64_t>{12, kSeq, 12}));  // step 3's length
}

TEST(EngineRandomLtd, AModelWithoutKwargsIsToldWhatToAdd) {
  auto model = std::make_shared<testing::TinyNetImpl>();
  json config = token_engine_config();
  auto engine = initialize(model, config).engine;
  auto [x, y] = testing::tiny_batch(0, 2);
  EXPECT_THROW_WITH(engine->forward(x, y), UsageError,
                    "data_efficiency.data_routing.random_ltd passes its schedule (random_ltd) to "
                    "the model's training forward");
}

}  // namespace
}  // namespace deepspeed

// Legacy curriculum learning and progressive layer drop: the schedules against DeepSpeed's own
// (tests/golden/curriculum_golden.py printed the expected values from DeepSpeed's sources), and
// what the engine hands the model's forward.
#include "deepspeed/deepspeed.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/expect_throw.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

namespace deepspeed {
namespace {

CurriculumLearningConfig curriculum(const std::string& body) {
  const std::string text = R"({"train_batch_size": 4, "curriculum_learning": {"enabled": true, )"
                           R"("curriculum_type": "seqlen", )" + body + "}}";
  return DeepSpeedConfig::from_string(text, 1).curriculum_learning;
}

std::vector<int64_t> run_schedule(CurriculumScheduler scheduler, int64_t first, int64_t last) {
  std::vector<int64_t> out;
  for (int64_t t = first; t <= last; ++t) out.push_back(scheduler.update_difficulty(t));
  return out;
}

TEST(CurriculumScheduler, FixedSchedulesMatchDeepSpeed) {
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
                   "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8})")),
                         1, 12),
            (std::vector<int64_t>{8, 16, 24, 24, 32, 40, 40, 48, 56, 64, 64, 64}));
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 16, "max_difficulty": 128, "schedule_type": "fixed_root",
                   "schedule_config": {"total_curriculum_step": 20, "difficulty_step": 8,
                                       "root_degree": 2})")),
                         0, 22),
            (std::vector<int64_t>{16, 40, 48, 56, 64, 72, 72, 80, 80, 88, 88, 96, 96, 104, 104,
                                  112, 112, 112, 120, 120, 128, 128, 128}));
  // Rounding down to a multiple of 16 gives 0 up to step 8; the floor is the first multiple of
  // the step at or above min_difficulty (DeepSpeed's PR #8334).
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
                   "schedule_config": {"total_curriculum_step": 20, "difficulty_step": 16})")),
                         0, 10),
            (std::vector<int64_t>{16, 16, 16, 16, 16, 16, 16, 16, 16, 32, 32}));
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_root",
                   "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 16,
                                       "root_degree": 3})")),
                         1, 11),
            (std::vector<int64_t>{32, 32, 32, 48, 48, 48, 48, 48, 48, 64, 64}));
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 5, "max_difficulty": 100, "schedule_type": "fixed_linear",
                   "schedule_config": {"total_curriculum_step": 7, "difficulty_step": 10})")),
                         1, 9),
            (std::vector<int64_t>{10, 30, 40, 50, 70, 80, 100, 100, 100}));
  EXPECT_EQ(run_schedule(CurriculumScheduler(curriculum(
                R"("min_difficulty": 1, "max_difficulty": 3, "schedule_type": "fixed_discrete",
                   "schedule_config": {"difficulty": [1, 2, 3], "max_step": [5, 10]})")),
                         1, 12),
            (std::vector<int64_t>{1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3}));
}

TEST(CurriculumScheduler, StopsAtMaxDifficultyAndRunsCustomSchedules) {
  CurriculumScheduler s(curriculum(
      R"("min_difficulty": 8, "max_difficulty": 32, "schedule_type": "custom")"));
  EXPECT_EQ(s.get_current_difficulty(), 8);
  EXPECT_THROW_WITH(s.update_difficulty(1), UsageError, "set_custom_get_difficulty");
  // A schedule that falls after reaching the maximum: DeepSpeed stops updating at the maximum.
  s.set_custom_get_difficulty([](int64_t t) { return t < 3 ? 16 * t : 8; });
  EXPECT_EQ(s.update_difficulty(1), 16);
  EXPECT_EQ(s.update_difficulty(2), 32);
  EXPECT_EQ(s.update_difficulty(3), 32);
  EXPECT_EQ(s.get_difficulty(3), 8);
}

TEST(ProgressiveLayerDrop, ThetaMatchesDeepSpeed) {
  const struct {
    double theta, gamma;
    std::vector<int64_t> steps;
    std::vector<double> expected;
  } cases[] = {
      {0.5, 0.001, {0, 1, 10, 100, 1000, 10000},
       {1.0, 0.9995002499166876, 0.995024916874584, 0.9524187090179798, 0.6839397205857212,
        0.5000226999648812}},
      {0.2, 0.01, {0, 3, 50, 400},
       {1.0, 0.9763564268388067, 0.6852245277701068, 0.21465251111098735}},
  };
  for (const auto& c : cases) {
    ProgressiveLayerDrop pld(c.theta, c.gamma);
    EXPECT_EQ(pld.get_theta(), 1.0);
    for (size_t i = 0; i < c.steps.size(); ++i) {
      pld.update_state(c.steps[i]);
      // numpy's exp and the C library's may differ in the last bit.
      EXPECT_NEAR(pld.get_theta(), c.expected[i], 4e-16) << "step " << c.steps[i];
    }
  }
}

// TinyNet whose forward takes the engine's kwargs and records them; with a "seqlen" curriculum
// it trains on the first curriculum_seqlen samples of the batch (a stand-in for tokens).
struct KwargsNetImpl : testing::TinyNetImpl {
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& y,
                        const ForwardKwargs& kwargs) {
    seen.push_back(kwargs);
    if (kwargs.curriculum_seqlen) {
      return TinyNetImpl::forward(x.slice(0, 0, *kwargs.curriculum_seqlen),
                                  y.slice(0, 0, *kwargs.curriculum_seqlen));
    }
    return TinyNetImpl::forward(x, y);
  }
  std::vector<ForwardKwargs> seen;
};

// ModuleEngine passes kwargs only to a forward that names them: not to TinyNet's, nor to
// Sequential's, whose variadic template accepts anything and hands it to its first module.
static_assert(kForwardTakesKwargs<KwargsNetImpl, at::Tensor, at::Tensor>);
static_assert(!kForwardTakesKwargs<testing::TinyNetImpl, at::Tensor, at::Tensor>);
static_assert(!kForwardTakesKwargs<torch::nn::SequentialImpl, at::Tensor>);

json engine_config(const json& extra) {
  json c = {{"train_micro_batch_size_per_gpu", 8},
            {"gradient_accumulation_steps", 2},
            {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
  c.update(extra);
  return c;
}

const json kSeqlenCurriculum = {
    {"curriculum_learning",
     {{"enabled", true}, {"curriculum_type", "seqlen"}, {"min_difficulty", 2},
      {"max_difficulty", 8}, {"schedule_type", "fixed_linear"},
      {"schedule_config", {{"total_curriculum_step", 3}, {"difficulty_step", 2}}}}}};

TEST(EngineForwardKwargs, CurriculumSeqlenFollowsTheGlobalStep) {
  auto model = std::make_shared<KwargsNetImpl>();
  auto engine = initialize(model, engine_config(kSeqlenCurriculum)).engine;
  ASSERT_NE(engine->curriculum_scheduler_legacy(), nullptr);
  EXPECT_FALSE(engine->get_pld_theta().has_value());
  std::vector<int64_t> lengths;
  for (int step = 0; step < 4; ++step) {
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = testing::tiny_batch(0, 8);
      engine->backward(engine->forward(x, y));
      engine->step();
      lengths.push_back(*engine->forward_kwargs().curriculum_seqlen);
    }
  }
  // DeepSpeed: difficulty(global_steps + 1) = floor(t/3 * 6 + 2) rounded down to even.
  EXPECT_EQ(lengths, (std::vector<int64_t>{4, 4, 6, 6, 8, 8, 8, 8}));
  ASSERT_EQ(model->seen.size(), 8u);
  EXPECT_FALSE(model->seen[0].progressive_layer_drop);
  // Evaluation gets no kwargs and leaves the difficulty alone.
  engine->eval();
  auto [x, y] = testing::tiny_batch(0, 8);
  engine->forward(x, y);
  EXPECT_TRUE(model->seen.back().empty());
  EXPECT_EQ(engine->curriculum_scheduler_legacy()->get_current_difficulty(), 8);
}

TEST(EngineForwardKwargs, TruncatedStepsEqualTrainingOnTheTruncatedBatches) {
  // The curriculum changes what the model trains on, nothing else: the same model trained
  // without one on batches cut to the scheduled lengths ends with the same weights.
  auto curriculum_model = std::make_shared<KwargsNetImpl>();
  auto with = initialize(curriculum_model, engine_config(kSeqlenCurriculum)).engine;
  auto plain_model = std::make_shared<testing::TinyNetImpl>();
  auto without = initialize(plain_model, engine_config(json::object())).engine;
  const int64_t lengths[] = {4, 4, 6, 6, 8, 8};
  for (int i = 0; i < 6; ++i) {
    auto [x, y] = testing::tiny_batch(8 * i, 8);
    with->backward(with->forward(x, y));
    with->step();
    without->backward(without->forward(x.slice(0, 0, lengths[i]), y.slice(0, 0, lengths[i])));
    without->step();
  }
  auto a = curriculum_model->parameters();
  auto b = plain_model->parameters();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

TEST(EngineForwardKwargs, ProgressiveLayerDropThetaUpdatesOnBoundaries) {
  auto model = std::make_shared<KwargsNetImpl>();
  auto engine = initialize(model, engine_config({{"progressive_layer_drop",
                                                  {{"enabled", true},
                                                   {"theta", 0.5},
                                                   {"gamma", 0.1}}}}))
                    .engine;
  EXPECT_EQ(engine->get_pld_theta(), 1.0);
  for (int step = 0; step < 3; ++step) {
    for (int m = 0; m < 2; ++m) {
      auto [x, y] = testing::tiny_batch(0, 8);
      engine->backward(engine->forward(x, y));
      engine->step();
    }
  }
  ASSERT_EQ(model->seen.size(), 6u);
  for (const auto& kw : model->seen) {
    EXPECT_TRUE(kw.progressive_layer_drop);
    EXPECT_FALSE(kw.curriculum_seqlen.has_value());
  }
  // Matches DeepSpeed: theta starts at 1 and the boundary of step t sets theta(t), t = 0, 1, ...
  auto theta = [](int64_t t) { return 0.5 * std::exp(-0.1 * static_cast<double>(t)) + 0.5; };
  EXPECT_EQ(model->seen[0].pld_theta, 1.0);
  EXPECT_EQ(model->seen[1].pld_theta, 1.0);
  EXPECT_DOUBLE_EQ(model->seen[2].pld_theta, theta(0));
  EXPECT_DOUBLE_EQ(model->seen[4].pld_theta, theta(1));
  EXPECT_DOUBLE_EQ(*engine->get_pld_theta(), theta(2));
}

// DeepSpeed restarts theta at 1 after a resume until the next boundary; here the resumed engine
// passes the theta the uninterrupted one would, and the curriculum continues from global_steps.
TEST(EngineForwardKwargs, ResumedEngineContinuesThetaAndCurriculum) {
  json both = engine_config({{"progressive_layer_drop",
                              {{"enabled", true}, {"theta", 0.5}, {"gamma", 0.1}}}});
  both.update(kSeqlenCurriculum);
  testing::TempDir dir;
  auto train = [](auto& engine, KwargsNetImpl& model, int micro_steps) {
    for (int m = 0; m < micro_steps; ++m) {
      auto [x, y] = testing::tiny_batch(0, 8);
      auto loss = engine.forward(x, y);
      engine.backward(loss);
      engine.step();
    }
    return model.seen.back();
  };
  auto model = std::make_shared<KwargsNetImpl>();
  auto engine = initialize(model, both).engine;
  train(*engine, *model, 4);  // 2 optimizer steps
  engine->save_checkpoint(dir.path());
  const ForwardKwargs uninterrupted = train(*engine, *model, 1);

  auto resumed_model = std::make_shared<KwargsNetImpl>();
  auto resumed = initialize(resumed_model, both).engine;
  resumed->load_checkpoint(dir.path());
  const ForwardKwargs after_resume = train(*resumed, *resumed_model, 1);
  EXPECT_EQ(after_resume.pld_theta, uninterrupted.pld_theta);
  EXPECT_LT(after_resume.pld_theta, 1.0);
  EXPECT_EQ(after_resume.curriculum_seqlen, uninterrupted.curriculum_seqlen);
  EXPECT_EQ(after_resume.curriculum_seqlen, 8);
}

TEST(EngineForwardKwargs, ModelWithoutKwargsParameterIsToldWhatToAdd) {
  auto model = std::make_shared<testing::TinyNetImpl>();
  auto engine = initialize(model, engine_config(kSeqlenCurriculum)).engine;
  auto [x, y] = testing::tiny_batch(0, 8);
  EXPECT_THROW_WITH(engine->forward(x, y), UsageError,
                    "curriculum_learning (curriculum_type \"seqlen\") passes curriculum_seqlen to "
                    "the model's training forward, but deepspeed::testing::TinyNetImpl::forward "
                    "takes no `const deepspeed::ForwardKwargs&`");
  // Evaluation passes nothing, so it runs.
  engine->eval();
  EXPECT_NO_THROW(engine->forward(x, y));
  // A non-seqlen curriculum passes nothing either: the model reads the difficulty itself.
  json vocab = kSeqlenCurriculum;
  vocab["curriculum_learning"]["curriculum_type"] = "vocab_rarity";
  auto model2 = std::make_shared<testing::TinyNetImpl>();
  auto engine2 = initialize(model2, engine_config(vocab)).engine;
  EXPECT_NO_THROW(engine2->forward(x, y));
  EXPECT_EQ(engine2->curriculum_scheduler_legacy()->get_current_difficulty(), 4);
}

}  // namespace
}  // namespace deepspeed

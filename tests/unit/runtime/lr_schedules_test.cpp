// LR schedules against DeepSpeed's formulas and worked examples (reference §4, Appendix A.5).
#include "deepspeed/lr_schedules.h"

#include <cmath>

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed::optim {
namespace {

// The lr each optimizer update n trains with: construction writes k=-1, then one step per update.
std::vector<double> lrs_used(const std::string& params_json, const std::string& type,
                             double base_lr, int n) {
  SchedulerConfig c;
  c.present = true;
  c.type = type;
  c.params = json::parse(params_json);
  double current = -1;
  LRScheduler s(make_lr_function(c, "cfg"), {base_lr}, [&](size_t, double lr) { current = lr; });
  std::vector<double> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(current);
    s.step();
  }
  return out;
}

TEST(LrSchedules, WarmupLrLogMatchesWorkedExample) {
  auto lr = lrs_used(R"({"warmup_min_lr": 0.1, "warmup_max_lr": 0.2, "warmup_num_steps": 10})",
                     "WarmupLR", 1.0, 14);
  EXPECT_DOUBLE_EQ(lr[0], 0.1);  // construction (k = -1)
  EXPECT_DOUBLE_EQ(lr[1], 0.1);  // k = 0: log(1) = 0
  EXPECT_NEAR(lr[2], 0.1 + 0.1 * std::log(2.0) / std::log(10.0), 1e-12);
  EXPECT_NEAR(lr[10], 0.1 + 0.1 * std::log(10.0) / std::log(10.0), 1e-12);  // k = 9
  EXPECT_DOUBLE_EQ(lr[11], 0.2);
  EXPECT_DOUBLE_EQ(lr[13], 0.2);
}

TEST(LrSchedules, WarmupLrLinearAndDefaultMaxIsGroupLr) {
  auto lr = lrs_used(R"({"warmup_min_lr": 0.1, "warmup_max_lr": 0.2, "warmup_num_steps": 10,
                        "warmup_type": "linear"})", "WarmupLR", 1.0, 4);
  EXPECT_DOUBLE_EQ(lr[1], 0.1);
  EXPECT_NEAR(lr[2], 0.11, 1e-12);
  EXPECT_NEAR(lr[3], 0.12, 1e-12);
  // warmup_max_lr unset: each group's own lr (DeepSpeed >= 0.17.2).
  auto lr2 = lrs_used(R"({"warmup_num_steps": 2})", "WarmupLR", 0.5, 5);
  EXPECT_DOUBLE_EQ(lr2[0], 0.0);
  EXPECT_DOUBLE_EQ(lr2[4], 0.5);
}

TEST(LrSchedules, WarmupDecayLrDecaysToZero) {
  auto lr = lrs_used(R"({"warmup_min_lr": 0, "warmup_max_lr": 1.0, "warmup_num_steps": 2,
                        "total_num_steps": 6, "warmup_type": "linear"})", "WarmupDecayLR", 1.0, 9);
  // k: -1 0 1 2 3 4 5 6 7 -> gamma 0, 0, .5, (6-2)/4, 3/4, 2/4, 1/4, 0, 0
  std::vector<double> want = {0, 0, 0.5, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lr[i], want[i], 1e-12) << i;
}

TEST(LrSchedules, WarmupCosineLrStartsAtZero) {
  auto lr = lrs_used(R"({"total_num_steps": 10, "warmup_num_steps": 2, "warmup_type": "linear",
                        "cos_min_ratio": 0.0})", "WarmupCosineLR", 2.0, 13);
  EXPECT_DOUBLE_EQ(lr[0], 0.0);  // construction sets lr = 0
  EXPECT_DOUBLE_EQ(lr[1], 0.0);  // k = 0, linear warm-up
  EXPECT_DOUBLE_EQ(lr[2], 1.0);  // k = 1: 2.0 * 1/2
  // k = 2 (first cosine step): p = 1/8 -> (1 + cos(pi/8)) / 2
  EXPECT_NEAR(lr[3], 2.0 * (1 + std::cos(M_PI / 8)) / 2, 1e-12);
  EXPECT_NEAR(lr[10], 0.0, 1e-12);  // k = 9: p = 1
}

TEST(LrSchedules, LrRangeTest) {
  auto lr = lrs_used(R"({"lr_range_test_min_lr": 0.01, "lr_range_test_step_size": 2,
                        "lr_range_test_step_rate": 1.0, "lr_range_test_staircase": true})",
                     "LRRangeTest", 1.0, 5);
  // k=-1: interval 0; k=0: floor(1/2)=0; k=1: 1; k=2: 1; k=3: 2
  std::vector<double> want = {0.01, 0.01, 0.02, 0.02, 0.03};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(lr[i], want[i], 1e-12) << i;
}

TEST(LrSchedules, StateDictRoundTrip) {
  SchedulerConfig c{true, "WarmupLR", json::parse(R"({"warmup_max_lr": 1.0, "warmup_num_steps": 4})")};
  double a = 0, b = 0;
  LRScheduler s1(make_lr_function(c, "cfg"), {1.0}, [&](size_t, double lr) { a = lr; });
  for (int i = 0; i < 3; ++i) s1.step();
  LRScheduler s2(make_lr_function(c, "cfg"), {1.0}, [&](size_t, double lr) { b = lr; });
  s2.load_state_dict(s1.state_dict());
  EXPECT_EQ(s1.state_dict()["last_batch_iteration"], 2);
  EXPECT_DOUBLE_EQ(a, b);
}

TEST(LrSchedules, BadParamsAreNamed) {
  SchedulerConfig c{true, "WarmupLR", json::parse(R"({"warmup_num_step": 4})")};
  EXPECT_THROW_WITH(make_lr_function(c, "cfg"), ConfigError,
                    "scheduler.params.warmup_num_step is not a parameter of WarmupLR");
  c.params = json::parse(R"({"warmup_num_steps": 0})");
  EXPECT_THROW_WITH(make_lr_function(c, "cfg"), ConfigError, "expected a positive integer");
  c = SchedulerConfig{true, "WarmupDecayLR", json::object()};
  EXPECT_THROW_WITH(make_lr_function(c, "cfg"), ConfigError, "total_num_steps is required");
}

}  // namespace
}  // namespace deepspeed::optim

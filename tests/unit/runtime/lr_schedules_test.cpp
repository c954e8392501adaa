// LR schedules against DeepSpeed's formulas and worked examples (reference §4, Appendix A.5),
// OneCycle's lr and momentum, per-group lists, and make_lr_scheduler on real optimizers.
#include "deepspeed/lr_schedules.h"

#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "deepspeed/optimizers.h"
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

TEST(LrSchedules, AutoIsRefusedNamingTheKey) {
  // Hugging Face fills the warm-up parameters from its TrainingArguments; read as the default,
  // "warmup_num_steps": "auto" warmed up over 1000 steps.
  for (auto [type, params, key] : {
           std::tuple{"WarmupLR", R"({"warmup_min_lr": "auto"})", "warmup_min_lr"},
           std::tuple{"WarmupLR", R"({"warmup_max_lr": "auto"})", "warmup_max_lr"},
           std::tuple{"WarmupLR", R"({"warmup_num_steps": "auto"})", "warmup_num_steps"},
           std::tuple{"WarmupLR", R"({"warmup_type": "auto"})", "warmup_type"},
           std::tuple{"WarmupDecayLR", R"({"total_num_steps": "auto"})", "total_num_steps"}}) {
    SchedulerConfig c{true, type, json::parse(params)};
    EXPECT_THROW_WITH(check_scheduler_supported(c, "cfg"), ConfigError,
                      std::string("cfg: scheduler.params.") + key +
                          " is \"auto\"; \"auto\" is a placeholder that the Hugging Face "
                          "integration fills in");
  }
}

SchedulerConfig sched(const std::string& type, const std::string& params) {
  return SchedulerConfig{true, type, json::parse(params)};
}

// --- independent references, written from reference §4 ----------------------------------

double warmup_ref(int64_t k, double lo, double hi, int64_t n_given, bool log, int64_t total,
                  bool decay) {
  const double n = static_cast<double>(std::max<int64_t>(2, n_given));
  if (k < 0) return lo;
  double gamma;
  if (k < n) {
    gamma = log ? std::log(k + 1.0) / std::log(n) : k / n;
  } else {
    gamma = decay ? std::max(0.0, (total - k) / std::max(1.0, total - n)) : 1.0;
  }
  return lo + (hi - lo) * gamma;
}

double cosine_ref(int64_t k, double base, double wmin, int64_t n_given, double cmin,
                  int64_t total, bool log) {
  const double n = static_cast<double>(std::max<int64_t>(2, n_given));
  if (k < 0) return 0.0;
  if (k < n) {
    const double r = log ? std::log(k + 1.0) / std::log(n) : k / n;
    return base * (wmin + r * (1 - wmin));
  }
  const double p = std::min(1.0, (k - n + 1) / std::max(1.0, total - n));
  return base * std::max(0.0, cmin + (1 - cmin) * (1 + std::cos(M_PI * p)) / 2);
}

struct OneCycleRef {
  double min_lr, max_lr, first, second, first_stairs, second_stairs;
  double decay_lr_rate = 0, decay_step_size = 0, min_mom = 0.8, max_mom = 0.9,
         decay_mom_rate = 0;

  double s(int64_t k) const {
    const double total = first + second, ratio = first / total, b = k + 1.0;
    const double x = 1 + b / total - std::floor(1 + b / total);
    double f = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
    const double stairs = x <= ratio ? first_stairs : second_stairs;
    if (stairs > 0) {
      const double ci = std::fmod(b, total);
      const double pos = ci <= first ? ci * stairs / first : (total - ci) * stairs / second;
      f = std::floor(pos) / stairs;
    }
    return f;
  }
  double lr(int64_t k) const {
    if (k < first + second) return min_lr + (max_lr - min_lr) * s(k);
    const double d = k - (first + second) + 1;
    if (decay_step_size == 0 || decay_lr_rate == 0) return min_lr;
    return min_lr / (1 + decay_lr_rate * d / decay_step_size);
  }
  double mom(int64_t k) const {
    if (k < 0) return min_mom;  // construction writes (min_mom, 0.99)
    if (k < first + second) return max_mom - (max_mom - min_mom) * s(k);
    const double d = k - (first + second) + 1;
    if (decay_step_size == 0 || decay_mom_rate == 0) return max_mom;
    return max_mom * (1 + decay_mom_rate * d / decay_step_size);
  }
};

// k at construction (-1), first step, warm-up end, middle, last, and beyond the end.
std::vector<int64_t> probe_points(int64_t n, int64_t total) {
  return {-1, 0, 1, n - 1, n, (n + total) / 2, total - 1, total, total + 7};
}

// Values the scheduler writes for k = -1, 0, 1, ... up to `k_max`.
std::vector<double> written_lrs(const SchedulerConfig& c, double base, int64_t k_max) {
  double current = -1;
  LRScheduler s(make_lr_schedule(c, 1, "cfg"), {base}, [&](size_t, double lr) { current = lr; });
  std::vector<double> out = {current};
  for (int64_t k = 0; k <= k_max; ++k) {
    s.step();
    out.push_back(current);
  }
  return out;  // out[k + 1] is lr(k)
}

TEST(LrSchedules, WarmupFamilyMatchesFormulasAtKeyPoints) {
  for (bool log : {true, false}) {
    for (int64_t n : {1, 10, 15, 33}) {
      for (int64_t total : {n, n + 20, int64_t{100}}) {
        SCOPED_TRACE("log " + std::to_string(log) + " n " + std::to_string(n) + " total " +
                     std::to_string(total));
        const std::string type = log ? "log" : "linear";
        auto warm = written_lrs(sched("WarmupLR", R"({"warmup_min_lr": 0.01, "warmup_max_lr": 0.3,
            "warmup_num_steps": )" + std::to_string(n) + R"(, "warmup_type": ")" + type + R"("})"),
                                1.0, total + 7);
        auto decay = written_lrs(sched("WarmupDecayLR", R"({"warmup_min_lr": 0.01,
            "warmup_num_steps": )" + std::to_string(n) + R"(, "warmup_type": ")" + type +
                                           R"(", "total_num_steps": )" + std::to_string(total) + "}"),
                                 1.0, total + 7);
        auto cosine = written_lrs(sched("WarmupCosineLR", R"({"warmup_min_ratio": 0.1,
            "cos_min_ratio": 0.05, "warmup_num_steps": )" + std::to_string(n) +
                                            R"(, "warmup_type": ")" + type +
                                            R"(", "total_num_steps": )" + std::to_string(total) +
                                            "}"),
                                  2.0, total + 7);
        for (int64_t k : probe_points(std::max<int64_t>(2, n), total)) {
          EXPECT_NEAR(warm[k + 1], warmup_ref(k, 0.01, 0.3, n, log, total, false), 1e-12) << k;
          EXPECT_NEAR(decay[k + 1], warmup_ref(k, 0.01, 0.001, n, log, total, true), 1e-12) << k;
          EXPECT_NEAR(cosine[k + 1], cosine_ref(k, 2.0, 0.1, n, 0.05, total, log), 1e-12) << k;
        }
      }
    }
  }
}

TEST(LrSchedules, WarmupCosineLrEndpoints) {
  // DeepSpeed's test: first == base * warmup_min_ratio, at N-1 == base (after warm-up's last
  // step), at T-1 == base * cos_min_ratio, and it stays there.
  auto lr = written_lrs(sched("WarmupCosineLR", R"({"warmup_min_ratio": 0.2, "cos_min_ratio": 0.1,
      "warmup_num_steps": 10, "total_num_steps": 30, "warmup_type": "linear"})"), 1.0, 40);
  EXPECT_DOUBLE_EQ(lr[0 + 1], 0.2);
  EXPECT_NEAR(lr[29 + 1], 0.1, 1e-12);
  EXPECT_NEAR(lr[40 + 1], 0.1, 1e-12);
}

TEST(LrSchedules, LrRangeTestMatchesFormula) {
  for (bool staircase : {false, true}) {
    auto lr = written_lrs(sched("LRRangeTest", std::string(R"({"lr_range_test_min_lr": 0.002,
        "lr_range_test_step_size": 7, "lr_range_test_step_rate": 0.5, "lr_range_test_staircase": )") +
                                    (staircase ? "true" : "false") + "}"),
                          1.0, 30);
    for (int64_t k = -1; k <= 30; ++k) {
      double interval = (k + 1) / 7.0;
      if (staircase) interval = std::floor(interval);
      EXPECT_NEAR(lr[k + 1], 0.002 * (1 + 0.5 * interval), 1e-15) << k;
    }
  }
}

TEST(LrSchedules, OneCycleLrAndMomentumMatchFormulas) {
  struct Case {
    const char* params;
    OneCycleRef ref;
  };
  std::vector<Case> cases = {
      {R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": 4})",
       {0.1, 1.0, 4, 4, 0, 0}},
      {R"({"cycle_min_lr": 0.01, "cycle_max_lr": 0.5, "cycle_first_step_size": 10,
           "cycle_second_step_size": 6, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
           "decay_lr_rate": 0.5, "decay_step_size": 3, "decay_mom_rate": 0.01})",
       {0.01, 0.5, 10, 6, 0, 0, 0.5, 3, 0.85, 0.95, 0.01}},
      {R"({"cycle_min_lr": 0.1, "cycle_max_lr": 0.9, "cycle_first_step_size": 8,
           "cycle_first_stair_count": 4, "decay_lr_rate": 0.1})",  // no decay_step_size: none
       {0.1, 0.9, 8, 8, 4, 4, 0.1, 0}},
      {R"({"cycle_min_lr": 0.1, "cycle_max_lr": 0.9, "cycle_first_step_size": 9,
           "cycle_second_step_size": 5, "cycle_first_stair_count": 3,
           "cycle_second_stair_count": 2, "decay_step_size": 2, "decay_lr_rate": 1.0})",
       {0.1, 0.9, 9, 5, 3, 2, 1.0, 2}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.params);
    LrSchedule s = make_lr_schedule(sched("OneCycle", c.params), 1, "cfg");
    ASSERT_TRUE(s.betas);
    const int64_t total = static_cast<int64_t>(c.ref.first + c.ref.second);
    for (int64_t k = -1; k < total + 12; ++k) {
      EXPECT_NEAR(s.lr(k, 0, 123.0), c.ref.lr(k), 1e-12) << k;
      auto [b1, b2] = s.betas(k, 0);
      EXPECT_NEAR(b1, c.ref.mom(k), 1e-12) << k;
      EXPECT_DOUBLE_EQ(b2, 0.99);
    }
  }
}

TEST(LrSchedules, OneCycleWorkedExample) {
  // first = second = 4, lr 0.1 -> 1.0, momentum 0.9 -> 0.8 and back.
  LrSchedule s = make_lr_schedule(
      sched("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0, "cycle_first_step_size": 4})"),
      1, "cfg");
  std::vector<double> want_lr = {0.1, 0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1, 0.1};
  std::vector<double> want_mom = {0.8, 0.875, 0.85, 0.825, 0.8, 0.825, 0.85, 0.875, 0.9, 0.9};
  for (int64_t k = -1; k <= 8; ++k) {
    EXPECT_NEAR(s.lr(k, 0, 0.0), want_lr[k + 1], 1e-12) << k;
    EXPECT_NEAR(s.betas(k, 0).first, want_mom[k + 1], 1e-12) << k;
  }
  // Stairs hold the lr flat: 2 stairs over 4 steps.
  s = make_lr_schedule(sched("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0,
      "cycle_first_step_size": 4, "cycle_first_stair_count": 2})"), 1, "cfg");
  std::vector<double> stairs = {0.1, 0.1, 0.55, 0.55, 1.0, 0.55, 0.55, 0.1, 0.1};
  for (int64_t k = -1; k <= 7; ++k) EXPECT_NEAR(s.lr(k, 0, 0.0), stairs[k + 1], 1e-12) << k;
}

TEST(LrSchedules, OneCycleWithoutMomentumAndItsErrors) {
  LrSchedule s = make_lr_schedule(sched("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0,
      "cycle_momentum": false})"), 1, "cfg");
  EXPECT_FALSE(s.betas);
  EXPECT_THROW_WITH(make_lr_schedule(sched("OneCycle", R"({"cycle_max_lr": 1.0})"), 1, "cfg"),
                    ConfigError, "cfg: scheduler.params.cycle_min_lr is required by OneCycle");
  EXPECT_THROW_WITH(make_lr_schedule(sched("OneCycle", R"({"cycle_min_lr": 0.1,
      "cycle_max_lr": 1.0, "cycle_first_step_size": 0})"), 1, "cfg"),
                    ConfigError, "cycle_first_step_size is 0; expected a positive number");
  EXPECT_THROW_WITH(make_lr_schedule(sched("OneCycle", R"({"cycle_min_lr": 0.1,
      "cycle_max_lr": 1.0, "cycle_max_momentum": 0.9})"), 1, "cfg"),
                    ConfigError, "scheduler.params.cycle_max_momentum is not a parameter of OneCycle");
}

TEST(LrSchedules, PerGroupListsNeedOneValuePerGroup) {
  auto c = sched("WarmupLR", R"({"warmup_min_lr": [0.0, 0.1], "warmup_max_lr": [1.0, 2.0],
                                 "warmup_num_steps": 2, "warmup_type": "linear"})");
  LrSchedule s = make_lr_schedule(c, 2, "cfg");
  EXPECT_DOUBLE_EQ(s.lr(-1, 0, 5.0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr(-1, 1, 5.0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(5, 0, 5.0), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(5, 1, 5.0), 2.0);
  EXPECT_THROW_WITH(make_lr_schedule(c, 3, "cfg"), ConfigError,
                    "scheduler.params.warmup_min_lr: expected 3 values for warmup_min_lr, got 2");
  EXPECT_NO_THROW(check_scheduler_supported(c, "cfg"));  // group count unknown at config time
  auto one_cycle = sched("OneCycle", R"({"cycle_min_lr": [0.1, 0.2], "cycle_max_lr": 1.0,
                                         "cycle_min_mom": [0.5, 0.6]})");
  s = make_lr_schedule(one_cycle, 2, "cfg");
  EXPECT_DOUBLE_EQ(s.lr(-1, 1, 0.0), 0.2);
  EXPECT_DOUBLE_EQ(s.betas(-1, 1).first, 0.6);
  EXPECT_THROW_WITH(make_lr_schedule(one_cycle, 1, "cfg"), ConfigError,
                    "expected 1 values for cycle_min_lr, got 2");
}

TEST(LrSchedules, UnknownWarmupTypeFallsBackToLog) {
  auto lr = written_lrs(sched("WarmupLR", R"({"warmup_max_lr": 1.0, "warmup_num_steps": 10,
                                              "warmup_type": "cubic"})"), 1.0, 3);
  EXPECT_NEAR(lr[2 + 1], std::log(3.0) / std::log(10.0), 1e-12);
}

TEST(LrSchedules, SchedulerWritesLrAndBetasIntoOurAndTorchOptimizers) {
  auto c = sched("OneCycle", R"({"cycle_min_lr": 0.1, "cycle_max_lr": 1.0,
                                 "cycle_first_step_size": 4})");
  at::Tensor p = torch::zeros({2}, torch::requires_grad());
  Adam adam({p});
  auto s = make_lr_scheduler(c, adam, "cfg");
  EXPECT_TRUE(s->cycles_momentum());
  // Construction: lr = min, betas = (min_mom, 0.99).
  EXPECT_DOUBLE_EQ(adam.group_options(0).get_lr(), 0.1);
  EXPECT_EQ(adam.group_options(0).pair("betas"), std::make_pair(0.8, 0.99));
  for (int i = 0; i < 4; ++i) s->step();  // k = 3: the peak
  EXPECT_DOUBLE_EQ(adam.group_options(0).get_lr(), 1.0);
  EXPECT_NEAR(adam.group_options(0).pair("betas").first, 0.8, 1e-12);
  EXPECT_DOUBLE_EQ(s->get_last_lr()[0], 1.0);

  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(0.5));
  s = make_lr_scheduler(c, adamw, "cfg");
  s->step();
  auto& o = static_cast<torch::optim::AdamWOptions&>(adamw.param_groups()[0].options());
  EXPECT_NEAR(o.lr(), 0.325, 1e-12);
  EXPECT_NEAR(std::get<0>(o.betas()), 0.875, 1e-12);
  EXPECT_DOUBLE_EQ(std::get<1>(o.betas()), 0.99);

  // No betas: momentum cycling is disabled (with a warning), the lr still cycles.
  SGD sgd({p}, SGDOptions{});
  s = make_lr_scheduler(c, sgd, "cfg");
  EXPECT_FALSE(s->cycles_momentum());
  s->step();
  EXPECT_NEAR(sgd.param_groups()[0].options().get_lr(), 0.325, 1e-12);
  torch::optim::SGD torch_sgd({p}, torch::optim::SGDOptions(0.5).momentum(0.9));
  s = make_lr_scheduler(c, torch_sgd, "cfg");
  EXPECT_FALSE(s->cycles_momentum());

  // WarmupLR without warmup_max_lr warms each group up to its own lr.
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p}, std::make_unique<GroupOptions>(AdamOptions{}.group()));
  AdamOptions second;
  second.lr = 0.5;
  at::Tensor q = torch::zeros({2}, torch::requires_grad());
  groups.emplace_back(std::vector<at::Tensor>{q}, std::make_unique<GroupOptions>(second.group()));
  Adam two(std::move(groups));
  s = make_lr_scheduler(sched("WarmupLR", R"({"warmup_num_steps": 2})"), two, "cfg");
  for (int i = 0; i < 3; ++i) s->step();
  EXPECT_DOUBLE_EQ(two.group_options(0).get_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(two.group_options(1).get_lr(), 0.5);
}

TEST(LrSchedules, OneCycleStateRestoresLrAndMomentumExactly) {
  auto c = sched("OneCycle", R"({"cycle_min_lr": 0.01, "cycle_max_lr": 0.2,
      "cycle_first_step_size": 5, "cycle_first_stair_count": 2, "decay_step_size": 2,
      "decay_lr_rate": 0.3, "decay_mom_rate": 0.02})");
  at::Tensor p = torch::zeros({2}, torch::requires_grad());
  Adam a({p}), b({p});
  auto sa = make_lr_scheduler(c, a, "cfg");
  for (int i = 0; i < 7; ++i) sa->step();
  auto sb = make_lr_scheduler(c, b, "cfg");
  sb->load_state_dict(sa->state_dict());
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(a.group_options(0).get_lr(), b.group_options(0).get_lr()) << i;
    EXPECT_EQ(a.group_options(0).pair("betas"), b.group_options(0).pair("betas")) << i;
    sa->step();
    sb->step();
  }
  EXPECT_EQ(sb->state_dict()["last_batch_iteration"], 14);
}

}  // namespace
}  // namespace deepspeed::optim

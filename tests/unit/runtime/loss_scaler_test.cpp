// Loss scalers against hand-derived sequences of DeepSpeed's update_scale (every expected value
// below is worked out from the algorithm in docs/precision.md, step by step in the comments),
// DeepSpeed's own test_dynamic_loss_scale.py / test_zero_optim_overflow.py cases, checkpoint
// state round trips, the factory and the unscale+clip divisor.
#include "runtime/precision/loss_scaler.h"

#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_throw.h"

namespace deepspeed::runtime {
namespace {

using nlohmann::json;

// One update_scale() per character: 'O' = overflow (the step is skipped), 'C' = clean.
struct Step {
  double scale;      // loss_scale() after the update
  int64_t hysteresis;
};

std::vector<Step> run_script(DynamicLossScaler& s, const std::string& script) {
  std::vector<Step> out;
  for (char c : script) {
    s.update_scale(c == 'O');
    out.push_back({s.loss_scale(), s.cur_hysteresis()});
  }
  return out;
}

void expect_steps(const std::vector<Step>& got, const std::vector<Step>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].scale, want[i].scale) << "scale after update " << i;
    EXPECT_EQ(got[i].hysteresis, want[i].hysteresis) << "hysteresis after update " << i;
  }
}

DynamicLossScalerOptions opts(double init, int64_t window, int64_t hysteresis,
                              bool consecutive = false, double min_scale = 1.0) {
  DynamicLossScalerOptions o;
  o.init_scale = init;
  o.scale_window = window;
  o.delayed_shift = hysteresis;
  o.consecutive_hysteresis = consecutive;
  o.min_scale = min_scale;
  return o;
}

Fp16Config fp16_config(int64_t power, int64_t window, int64_t hysteresis = 2,
                       double min_loss_scale = 1.0) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = power;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = min_loss_scale;
  return c;
}

// Inventory Appendix A.3: defaults (2^16, window 1000, hysteresis 2, not consecutive).
TEST(DynamicLossScaler, DefaultsHysteresisAbsorbsFirstOverflowThenDoublesAfterWindowPlusOne) {
  DynamicLossScaler s(opts(65536, 1000, 2));
  s.update_scale(true);  // iter 0: budget 2 -> 1, scale kept
  EXPECT_EQ(s.loss_scale(), 65536);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(s.last_overflow_iter(), 0);
  s.update_scale(true);  // iter 1: budget spent -> halve
  EXPECT_EQ(s.loss_scale(), 32768);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_EQ(s.last_overflow_iter(), 1);
  // iters 2..1001: stable = 0..999, no doubling.
  for (int i = 2; i <= 1001; ++i) {
    s.update_scale(false);
    ASSERT_EQ(s.loss_scale(), 32768) << "iter " << i;
    ASSERT_EQ(s.cur_hysteresis(), 1) << "iter " << i;
  }
  s.update_scale(false);  // iter 1002: stable = 1000 -> double, budget refilled
  EXPECT_EQ(s.loss_scale(), 65536);
  EXPECT_EQ(s.cur_hysteresis(), 2);
  EXPECT_EQ(s.cur_iter(), 1003);
  s.update_scale(true);  // budget 2 again: absorbed
  EXPECT_EQ(s.loss_scale(), 65536);
  EXPECT_EQ(s.cur_hysteresis(), 1);
}

// From the start last_overflow_iter is -1, so the first doubling is at cur_iter == window.
TEST(DynamicLossScaler, FirstDoublingAtIterationEqualToWindow) {
  DynamicLossScaler s(opts(8, 3, 2));
  // iter: 0 (stable 0), 1 (1), 2 (2), 3 (3 -> x2), 4, 5, 6 (6 -> x2)
  expect_steps(run_script(s, "CCCCCCC"),
               {{8, 2}, {8, 2}, {8, 2}, {16, 2}, {16, 2}, {16, 2}, {32, 2}});
}

TEST(DynamicLossScaler, HysteresisOneHalvesOnEveryOverflow) {
  DynamicLossScaler s(opts(256, 2, 1));
  // O@0 -> 128, O@1 -> 64, C@2 (stable 0), C@3 (1), C@4 (2 -> 128), O@5 -> 64
  expect_steps(run_script(s, "OOCCCO"), {{128, 1}, {64, 1}, {64, 1}, {64, 1}, {128, 1}, {64, 1}});
  EXPECT_EQ(s.cur_iter(), 6);
  EXPECT_EQ(s.last_overflow_iter(), 5);
}

// The same script under the two hysteresis modes (hysteresis 2, window 3, start 1024).
TEST(DynamicLossScaler, ConsecutiveHysteresisRefillsBudgetOnEveryCleanStep) {
  DynamicLossScaler s(opts(1024, 3, 2, /*consecutive=*/true));
  // O@0 budget 2->1 | C@1 refill | O@2 2->1 | C@3 refill | O@4 2->1 | O@5 halve 512 |
  // C@6..C@8 refill, stable 0,1,2 | C@9 stable 3 -> 1024 | O@10 2->1
  expect_steps(run_script(s, "OCOCOOCCCCO"),
               {{1024, 1}, {1024, 2}, {1024, 1}, {1024, 2}, {1024, 1}, {512, 1},
                {512, 2}, {512, 2}, {512, 2}, {1024, 2}, {1024, 1}});
}

TEST(DynamicLossScaler, NonConsecutiveHysteresisRefillsOnlyWhenScaleDoubles) {
  DynamicLossScaler s(opts(1024, 3, 2, /*consecutive=*/false));
  // O@0 2->1 | C@1 | O@2 halve 512 | C@3 | O@4 256 | O@5 128 | C@6..8 stable 0..2 |
  // C@9 stable 3 -> 256, budget 2 | O@10 2->1
  expect_steps(run_script(s, "OCOCOOCCCCO"),
               {{1024, 1}, {1024, 1}, {512, 1}, {512, 1}, {256, 1}, {128, 1},
                {128, 1}, {128, 1}, {128, 1}, {256, 2}, {256, 1}});
}

TEST(DynamicLossScaler, HysteresisThreeAbsorbsTwoOverflows) {
  DynamicLossScaler s(opts(64, 100, 3));
  expect_steps(run_script(s, "OOOO"), {{64, 2}, {64, 1}, {32, 1}, {16, 1}});
}

TEST(DynamicLossScaler, WindowOfOneDoublesOnEveryCleanStepButTheFirstAfterOverflow) {
  DynamicLossScaler s(opts(8, 1, 1));
  // C@0 stable 0 | C@1 1 -> 16 | C@2 2 -> 32 | O@3 16 | C@4 stable 0 | C@5 1 -> 32
  expect_steps(run_script(s, "CCCOCC"), {{8, 1}, {16, 1}, {32, 1}, {16, 1}, {16, 1}, {32, 1}});
}

// A clean step resets the window count only through last_overflow_iter: an overflow absorbed by
// hysteresis still restarts it.
TEST(DynamicLossScaler, AbsorbedOverflowStillRestartsTheWindow) {
  DynamicLossScaler s(opts(16, 2, 2));
  // C@0 s0 | C@1 s1 | O@2 absorbed (2->1) | C@3 s0 | C@4 s1 | C@5 s2 -> 32, budget 2
  expect_steps(run_script(s, "CCOCCC"), {{16, 2}, {16, 2}, {16, 1}, {16, 1}, {16, 1}, {32, 2}});
}

TEST(DynamicLossScaler, ClampsAtFloorThenRaisesOnNextOverflow) {
  DynamicLossScaler s(opts(16, 1000, 1, false, /*min_scale=*/3));
  expect_steps(run_script(s, "OOO"), {{8, 1}, {4, 1}, {3, 1}});
  EXPECT_THROW_WITH(s.update_scale(true), Error,
                    "Current loss scale already at minimum - cannot decrease scale anymore");
  // DeepSpeed raises before touching any state.
  EXPECT_EQ(s.loss_scale(), 3);
  EXPECT_EQ(s.cur_iter(), 3);
  EXPECT_EQ(s.last_overflow_iter(), 2);
}

TEST(DynamicLossScaler, AtFloorHysteresisStillAbsorbsBeforeRaising) {
  DynamicLossScaler s(opts(1, 1000, 2));
  s.update_scale(true);  // budget 2 -> 1: no raise yet
  EXPECT_EQ(s.loss_scale(), 1);
  EXPECT_EQ(s.cur_hysteresis(), 1);
  EXPECT_THROW_WITH(s.update_scale(true), Error, "already at minimum");
}

TEST(DynamicLossScaler, WithoutRaiseClampsAtFloorForever) {
  DynamicLossScalerOptions o = opts(4, 1000, 1);
  o.raise_error_at_min_scale = false;
  DynamicLossScaler s(o);
  expect_steps(run_script(s, "OOOOO"), {{2, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}});
}

// DeepSpeed compares the scale with the floor for equality, so a scale below the floor (a
// 2^initial_scale_power under min_loss_scale) is lifted to the floor by the next overflow.
TEST(DynamicLossScaler, ScaleBelowFloorIsLiftedToItOnOverflow) {
  DynamicLossScaler s(opts(1, 1000, 1, false, /*min_scale=*/4));
  s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 4);
}

// DeepSpeed halves when delayed_shift == 1 OR the budget is 1: a restored budget larger than a
// hysteresis of 1 (a checkpoint edited or written by another version) does not delay halving.
TEST(DynamicLossScaler, HysteresisOneHalvesEvenWithARestoredBudget) {
  DynamicLossScaler s(opts(64, 10, 1));
  json sd = s.state_dict();
  sd["cur_hysteresis"] = 3;
  s.load_state_dict(sd);
  s.update_scale(true);
  EXPECT_EQ(s.loss_scale(), 32);
  EXPECT_EQ(s.cur_hysteresis(), 3);
}

TEST(DynamicLossScaler, RejectsBadOptions) {
  EXPECT_THROW_WITH(DynamicLossScaler(opts(0, 10, 2)), ConfigError, "initial scale");
  EXPECT_THROW_WITH(DynamicLossScaler(opts(8, 0, 2)), ConfigError, "fp16.loss_scale_window");
  EXPECT_THROW_WITH(DynamicLossScaler(opts(8, 10, 0)), ConfigError, "fp16.hysteresis");
  EXPECT_THROW_WITH(DynamicLossScaler(opts(8, 10, 2, false, 0)), ConfigError,
                    "fp16.min_loss_scale");
}

TEST(StaticLossScaler, NeverChanges) {
  LossScaler s(128);
  EXPECT_FALSE(s.dynamic());
  for (bool overflow : {true, true, false, true, false, false}) {
    s.update_scale(overflow);
    EXPECT_EQ(s.loss_scale(), 128);
  }
  EXPECT_EQ(s.cur_iter(), 6);
  EXPECT_THROW_WITH(LossScaler(0.0), ConfigError, "fp16.loss_scale");
  EXPECT_THROW_WITH(LossScaler(-2.0), ConfigError, "fp16.loss_scale");
}

// ---- DeepSpeed's tests/unit/runtime/half_precision/test_zero_optim_overflow.py (ZeRO 1/2) ----

TEST(DeepSpeedZeroOverflowTests, NoOverflow) {
  auto s = make_loss_scaler(fp16_config(8, 2));
  ASSERT_TRUE(s->dynamic());
  double expected = 256;
  EXPECT_EQ(s->loss_scale(), expected);
  for (int i = 0; i < 10; ++i) {
    s->update_scale(false);
    EXPECT_EQ(s->loss_scale(), expected) << i;
    EXPECT_EQ(s->cur_iter(), i + 1);
    if (s->cur_iter() % 2 == 0) expected *= 2;
  }
}

TEST(DeepSpeedZeroOverflowTests, AllOverflow) {
  // inf, -inf, nan x 6 with initial_scale_power = 8 and hysteresis 1: down to exactly 1.
  auto s = make_loss_scaler(fp16_config(8, 2, /*hysteresis=*/1));
  double expected = 256;
  for (int i = 0; i < 8; ++i) {
    s->update_scale(true);
    expected = std::max(expected / 2, 1.0);
    EXPECT_EQ(s->loss_scale(), expected) << i;
    EXPECT_EQ(s->cur_iter(), i + 1);
  }
  EXPECT_EQ(s->loss_scale(), 1);
  // One more overflow at the floor is DeepSpeed ZeRO's "Exiting run" error.
  EXPECT_THROW_WITH(s->update_scale(true), Error, "already at minimum");
}

TEST(DeepSpeedZeroOverflowTests, SomeOverflow) {
  auto s = make_loss_scaler(fp16_config(8, 2, /*hysteresis=*/1));
  double expected = 256;
  int64_t iteration = 0;
  for (int i = 0; i < 2; ++i) s->update_scale(true);  // inf, nan
  iteration += 2;
  expected /= 4;
  EXPECT_EQ(s->loss_scale(), expected);
  EXPECT_EQ(s->cur_iter(), iteration);
  for (int i = 0; i < 3; ++i) s->update_scale(false);  // scale_window + 1 clean steps
  iteration += 3;
  expected *= 2;
  EXPECT_EQ(s->loss_scale(), expected);
  EXPECT_EQ(s->cur_iter(), iteration);
  s->update_scale(true);
  iteration += 1;
  expected /= 2;
  EXPECT_EQ(s->loss_scale(), expected);
  EXPECT_EQ(s->cur_iter(), iteration);
}

// The same "some overflow" script with ZeRO's default hysteresis 2 differs (derived): the
// first overflow is absorbed, so the scale goes 256, 128, then back to 256 and stays.
TEST(DeepSpeedZeroOverflowTests, SomeOverflowWithDefaultHysteresis) {
  auto s = make_loss_scaler(fp16_config(8, 2));
  auto* d = dynamic_cast<DynamicLossScaler*>(s.get());
  ASSERT_NE(d, nullptr);
  expect_steps(run_script(*d, "OOCCCO"), {{256, 1}, {128, 1}, {128, 1}, {128, 1}, {256, 2},
                                          {256, 1}});
}

// ---- DeepSpeed's tests/unit/runtime/half_precision/test_dynamic_loss_scale.py (FP16_Optimizer
// and FP16_UnfusedOptimizer: no hysteresis, clamp at the floor) ----

TEST(DeepSpeedFp16OptimizerTests, NoOverflow) {
  auto s = make_loss_scaler(fp16_config(8, 2), LossScalerFlavor::kFp16Optimizer);
  double expected = 256;
  for (int i = 0; i < 10; ++i) {
    s->update_scale(false);
    EXPECT_EQ(s->loss_scale(), expected) << i;
    EXPECT_EQ(s->cur_iter(), i + 1);
    if (s->cur_iter() % 2 == 0) expected *= 2;
  }
}

TEST(DeepSpeedFp16OptimizerTests, AllOverflowFusedClampsAtOne) {
  // initial_scale_power 4, default hysteresis (ignored) and min_loss_scale 1: 8 overflows.
  auto s = make_loss_scaler(fp16_config(4, 2), LossScalerFlavor::kFp16Optimizer);
  double expected = 16;
  for (int i = 0; i < 8; ++i) {
    s->update_scale(true);
    expected = std::max(expected / 2, 1.0);
    EXPECT_EQ(s->loss_scale(), expected) << i;
    EXPECT_EQ(s->cur_iter(), i + 1);
  }
}

TEST(DeepSpeedFp16OptimizerTests, AllOverflowUnfusedClampsAtMinLossScaleTwo) {
  auto s = make_loss_scaler(fp16_config(4, 2, 2, /*min_loss_scale=*/2.0),
                            LossScalerFlavor::kFp16Optimizer);
  auto* d = dynamic_cast<DynamicLossScaler*>(s.get());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->options().min_scale, 2.0);
  double expected = 16;
  for (int i = 0; i < 8; ++i) {
    s->update_scale(true);
    expected = std::max(expected / 2, 2.0);
    EXPECT_EQ(s->loss_scale(), expected) << i;
  }
}

TEST(DeepSpeedFp16OptimizerTests, SomeOverflow) {
  auto s = make_loss_scaler(fp16_config(8, 2), LossScalerFlavor::kFp16Optimizer);
  s->update_scale(true);
  s->update_scale(true);
  EXPECT_EQ(s->loss_scale(), 64);
  EXPECT_EQ(s->cur_iter(), 2);
  for (int i = 0; i < 3; ++i) s->update_scale(false);
  EXPECT_EQ(s->loss_scale(), 128);
  EXPECT_EQ(s->cur_iter(), 5);
  s->update_scale(true);
  EXPECT_EQ(s->loss_scale(), 64);
  EXPECT_EQ(s->cur_iter(), 6);
}

// ---- factory ----

TEST(MakeLossScaler, FollowsFp16Section) {
  Fp16Config off;  // fp16 disabled: DeepSpeed's LossScaler(1.0) for bf16/fp32
  auto s = make_loss_scaler(off);
  EXPECT_FALSE(s->dynamic());
  EXPECT_EQ(s->loss_scale(), 1.0);

  Fp16Config fixed = fp16_config(16, 1000);
  fixed.loss_scale = 512;
  s = make_loss_scaler(fixed);
  EXPECT_FALSE(s->dynamic());
  EXPECT_EQ(s->loss_scale(), 512);

  Fp16Config dyn;
  dyn.enabled = true;  // every other key at DeepSpeed's default
  s = make_loss_scaler(dyn);
  auto* d = dynamic_cast<DynamicLossScaler*>(s.get());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->loss_scale(), 65536);
  EXPECT_EQ(d->options().scale_window, 1000);
  EXPECT_EQ(d->options().delayed_shift, 2);
  EXPECT_EQ(d->options().min_scale, 1);
  EXPECT_FALSE(d->options().consecutive_hysteresis);
  EXPECT_TRUE(d->options().raise_error_at_min_scale);
  EXPECT_EQ(d->scale_factor(), 2.0);
  EXPECT_EQ(d->last_overflow_iter(), -1);
  EXPECT_EQ(d->cur_hysteresis(), 2);

  s = make_loss_scaler(dyn, LossScalerFlavor::kFp16Optimizer);
  d = dynamic_cast<DynamicLossScaler*>(s.get());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->options().delayed_shift, 1);
  EXPECT_FALSE(d->options().raise_error_at_min_scale);
}

TEST(MakeLossScaler, FromParsedDsConfig) {
  json j = {{"train_batch_size", 1},
            {"fp16",
             {{"enabled", true},
              {"initial_scale_power", 8},
              {"loss_scale_window", 2},
              {"hysteresis", 1},
              {"consecutive_hysteresis", true},
              {"min_loss_scale", 2}}}};
  auto cfg = DeepSpeedConfig::from_json(j, 1);
  auto s = make_loss_scaler(cfg.fp16);
  auto* d = dynamic_cast<DynamicLossScaler*>(s.get());
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->loss_scale(), 256);
  EXPECT_EQ(d->options().scale_window, 2);
  EXPECT_EQ(d->options().delayed_shift, 1);
  EXPECT_TRUE(d->options().consecutive_hysteresis);
  EXPECT_EQ(d->options().min_scale, 2);
}

TEST(MakeLossScaler, RejectsWhatDeepSpeedRejects) {
  // DeepSpeed's min_loss_scale is an int field: 0.5 fails validation, 2.0 is accepted.
  EXPECT_THROW_WITH(make_loss_scaler(fp16_config(8, 2, 2, 0.5)), ConfigError,
                    "fp16.min_loss_scale is 0.5; expected an integer");
  EXPECT_NO_THROW(make_loss_scaler(fp16_config(8, 2, 2, 2.0)));
  EXPECT_THROW_WITH(make_loss_scaler(fp16_config(2000, 2)), ConfigError,
                    "fp16.initial_scale_power is 2000");
}

// ---- checkpoint state ----

TEST(LossScalerState, DynamicStateDictUsesDeepSpeedFieldNames) {
  DynamicLossScaler s(opts(1024, 3, 2, true, 2));
  run_script(s, "OCO");
  json sd = s.state_dict();
  EXPECT_EQ(sd.at("cur_scale").get<double>(), 1024);
  EXPECT_EQ(sd.at("dynamic").get<bool>(), true);
  EXPECT_EQ(sd.at("cur_iter").get<int64_t>(), 3);
  EXPECT_EQ(sd.at("last_overflow_iter").get<int64_t>(), 2);
  EXPECT_EQ(sd.at("scale_factor").get<double>(), 2.0);
  EXPECT_EQ(sd.at("scale_window").get<int64_t>(), 3);
  EXPECT_EQ(sd.at("min_scale").get<double>(), 2);
  EXPECT_EQ(sd.at("delayed_shift").get<int64_t>(), 2);
  EXPECT_EQ(sd.at("cur_hysteresis").get<int64_t>(), 1);
  EXPECT_EQ(sd.at("consecutive_hysteresis").get<bool>(), true);
  EXPECT_EQ(sd.at("raise_error_at_min_scale").get<bool>(), true);
}

TEST(LossScalerState, RoundTripResumesTheSameSequence) {
  const std::string before = "OOCCCCOC";
  const std::string after = "CCCOOOCCCCCO";
  DynamicLossScaler a(opts(4096, 3, 2));
  run_script(a, before);
  // Through text, as a checkpoint file would carry it; the target starts from other options,
  // which the checkpoint's replace (DeepSpeed unpickles the whole scaler).
  json sd = json::parse(a.state_dict().dump());
  DynamicLossScaler b(opts(8, 1000, 5, true, 1));
  b.load_state_dict(sd);
  EXPECT_EQ(b.state_dict(), a.state_dict());
  expect_steps(run_script(b, after), run_script(a, after));

  auto c = loss_scaler_from_state_dict(sd);
  ASSERT_TRUE(c->dynamic());
  EXPECT_EQ(c->state_dict(), sd);
}

TEST(LossScalerState, StaticRoundTrip) {
  LossScaler a(64);
  a.update_scale(false);
  json sd = a.state_dict();
  EXPECT_EQ(sd, (json{{"cur_scale", 64.0}, {"dynamic", false}, {"cur_iter", 1}}));
  LossScaler b(1);
  b.load_state_dict(sd);
  EXPECT_EQ(b.loss_scale(), 64);
  EXPECT_EQ(b.cur_iter(), 1);
  auto c = loss_scaler_from_state_dict(json{{"cur_scale", 32}, {"dynamic", false}});
  EXPECT_FALSE(c->dynamic());
  EXPECT_EQ(c->loss_scale(), 32);
  EXPECT_EQ(c->cur_iter(), 0);
}

TEST(LossScalerState, LoadRejectsKindMismatchAndBadFields) {
  DynamicLossScaler d(opts(8, 2, 2));
  LossScaler st(8);
  EXPECT_THROW_WITH(st.load_state_dict(d.state_dict()), CheckpointError,
                    "holds a dynamic loss scaler, this one is static");
  EXPECT_THROW_WITH(d.load_state_dict(st.state_dict()), CheckpointError,
                    "holds a static loss scaler, this one is dynamic");
  json sd = d.state_dict();
  sd.erase("cur_hysteresis");
  EXPECT_THROW_WITH(d.load_state_dict(sd), CheckpointError, "'cur_hysteresis' is missing");
  sd = d.state_dict();
  sd["cur_iter"] = "seven";
  EXPECT_THROW_WITH(d.load_state_dict(sd), CheckpointError, "'cur_iter' is \"seven\"");
  sd = d.state_dict();
  sd["scale_factor"] = 4.0;
  EXPECT_THROW_WITH(d.load_state_dict(sd), CheckpointError, "'scale_factor' is 4");
  sd = d.state_dict();
  sd["scale_window"] = 0;
  EXPECT_THROW_WITH(d.load_state_dict(sd), CheckpointError, "fp16.loss_scale_window is 0");
  // A failed load leaves the scaler as it was.
  EXPECT_EQ(d.state_dict(), DynamicLossScaler(opts(8, 2, 2)).state_dict());
}

// ---- unscale + clip (inventory §2.5) ----

TEST(CombinedScale, UnscalesAndClipsInOneDivisor) {
  EXPECT_EQ(combined_scale(1e9, 1024, 0.0), 1024);  // clipping off: unscale only
  EXPECT_EQ(combined_scale(512, 1024, 1.0), 1024);  // unscaled norm 0.5 < clip
  // unscaled norm 10, clip 2: c = (10 + 1e-6) / 2 -> divisor 1024 * c
  EXPECT_DOUBLE_EQ(combined_scale(10240, 1024, 2.0), 1024 * ((10.0 + 1e-6) / 2.0));
  // unscaled norm exactly at clip: c = (1 + 1e-6) / 1 > 1, clipped by the epsilon
  EXPECT_DOUBLE_EQ(combined_scale(1024, 1024, 1.0), 1024 * (1.0 + 1e-6));
  EXPECT_TRUE(std::isnan(combined_scale(NAN, 1024, 1.0)));
  // Dividing the scaled gradients by it leaves an unscaled gradient of norm ~clip.
  const double scaled_norm = 3.0e4 * 128;
  const double divisor = combined_scale(scaled_norm, 128, 5.0);
  EXPECT_NEAR(scaled_norm / divisor, 5.0, 1e-5);
}

}  // namespace
}  // namespace deepspeed::runtime

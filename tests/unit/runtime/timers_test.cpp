// Timers and ThroughputTimer on a fake clock: DeepSpeed's "time (ms) | name: 12.34" line (timers
// never started left out, normalizer, reset, memory figures) and the RunningAvgSamplesPerSec /
// CurrSamplesPerSec arithmetic with its 2 warm-up steps and steps_per_print cadence.
#include "runtime/timers.h"

#include <gtest/gtest.h>

#include "deepspeed/errors.h"
#include "support/expect_throw.h"

namespace deepspeed::runtime {
namespace {

// Time moves only when the test says so (in binary fractions where a sum must be exact).
struct FakeClock {
  double now_s = 100.0;
  Clock clock() {
    return [this] { return now_s; };
  }
};

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(Timers, LineHasDeepSpeedsFormatAndSkipsTimersNeverStarted) {
  FakeClock t;
  Timers timers(t.clock());
  timers.start("fwd");
  t.now_s += 0.25;
  timers.stop("fwd");
  timers.start("bwd");
  t.now_s += 0.0078125;
  timers.stop("bwd");
  timers.start("step");
  timers.stop("step");  // started, zero length: still listed
  // bwd_inner was never started: DeepSpeed's log() leaves it out rather than printing 0.
  EXPECT_EQ(timers.log({"fwd", "bwd", "bwd_inner", "step"}),
            "time (ms) | fwd: 250.00 | bwd: 7.81 | step: 0.00");
  EXPECT_FALSE(timers.has("bwd_inner"));
  // log() reset the listed timers (DeepSpeed's default); they stay known.
  EXPECT_EQ(timers.log({"fwd", "bwd"}), "time (ms) | fwd: 0.00 | bwd: 0.00");
  EXPECT_EQ(timers.log({"nothing"}), "time (ms)");
}

TEST(Timers, AccumulateUntilResetAndAverageWithNormalizer) {
  FakeClock t;
  Timers timers(t.clock());
  for (double ms : {8.0, 16.0, 24.0}) {
    timers.start("fwd_microstep");
    t.now_s += ms / 1000.0;
    timers.stop("fwd_microstep");
    t.now_s += 1.0;  // time outside start/stop is not counted
  }
  EXPECT_NEAR(timers.elapsed_ms("fwd_microstep"), 48.0, 1e-9);
  // reset=false keeps the total; the normalizer turns it into a per-step mean.
  EXPECT_EQ(timers.log({"fwd_microstep"}, 3.0, /*reset=*/false),
            "time (ms) | fwd_microstep: 16.00");
  EXPECT_EQ(timers.log({"fwd_microstep"}, 1.0, /*reset=*/true),
            "time (ms) | fwd_microstep: 48.00");
  EXPECT_DOUBLE_EQ(timers.elapsed_ms("fwd_microstep"), 0.0);
  EXPECT_THROW_WITH(timers.log({"fwd_microstep"}, 0.0), UsageError, "normalizer");
}

TEST(Timers, RunningTimerCountsUpToNowAndKeepsRunning) {
  FakeClock t;
  Timers timers(t.clock());
  timers.start("step");
  t.now_s += 0.5;
  EXPECT_DOUBLE_EQ(timers.elapsed_ms("step"), 500.0);
  EXPECT_EQ(timers.log({"step"}), "time (ms) | step: 500.00");
  t.now_s += 0.125;  // still running after the reset: counts from the log call
  timers.stop("step");
  EXPECT_DOUBLE_EQ(timers.elapsed_ms("step"), 125.0);
  timers.stop("step");  // not running: no-op
  EXPECT_DOUBLE_EQ(timers.elapsed_ms("step"), 125.0);
}

TEST(Timers, MemoryBreakdownAppendsDeepSpeedsFigures) {
  FakeClock t;
  Timers timers(t.clock());
  timers.start("fwd_microstep");
  t.now_s += 0.0625;
  timers.stop("fwd_microstep");
  TimerMemoryUsage m{static_cast<int64_t>(1.5 * kGiB), 2 * static_cast<int64_t>(kGiB),
                     static_cast<int64_t>(0.25 * kGiB), 3 * static_cast<int64_t>(kGiB)};
  EXPECT_EQ(timers.log({"fwd_microstep"}, 1.0, true, m),
            "time (ms) | fwd_microstep: 62.50 | mem_allocated: 1.5000 GB | max_mem_allocated: "
            "2.0000 GB | cache_allocated: 0.2500 GB | max_cache_allocated: 3.0000 GB");
}

TEST(Timers, SynchronizeRunsBeforeEveryClockRead) {
  FakeClock t;
  Timers timers(t.clock());
  int syncs = 0;
  timers.set_synchronize([&] { ++syncs; });
  timers.start("a");
  timers.stop("a");
  EXPECT_EQ(syncs, 2);
}

// GAS 2, 8 samples per optimizer step; micro-steps last `micro_s`, with 1 s between them that
// the throughput timer must not count (data loading).
bool run_step(ThroughputTimer& tp, FakeClock& t, double micro_s) {
  bool report = false;
  for (int m = 0; m < 2; ++m) {
    t.now_s += 1.0;
    tp.start();
    t.now_s += micro_s;
    report = tp.stop(/*global_step=*/m == 1);
    EXPECT_TRUE(m == 1 || !report);
  }
  return report;
}

TEST(ThroughputTimer, RunningAverageSkipsTwoWarmUpStepsAndReportsEveryStepsPerPrint) {
  FakeClock t;
  ThroughputTimerOptions o;
  o.batch_size = 8;
  o.steps_per_output = 2;
  ThroughputTimer tp(o, t.clock());
  EXPECT_FALSE(tp.avg_samples_per_sec());
  // Steps 1 and 2 are DeepSpeed's warm-up: not timed, not reported (2 % 2 == 0 notwithstanding).
  EXPECT_FALSE(run_step(tp, t, 4.0));
  EXPECT_FALSE(run_step(tp, t, 4.0));
  EXPECT_FALSE(tp.avg_samples_per_sec());
  EXPECT_EQ(tp.global_step_count(), 2);
  EXPECT_EQ(tp.micro_step_count(), 4);
  // Step 3: 2 x 0.125 s -> 8 / 0.25 = 32 samples/s, not a multiple of steps_per_print.
  EXPECT_FALSE(run_step(tp, t, 0.125));
  EXPECT_DOUBLE_EQ(*tp.avg_samples_per_sec(), 32.0);
  EXPECT_NEAR(*tp.curr_samples_per_sec(), 32.0, 1e-3);
  // Step 4: 2 x 0.25 s. Running average = 8 * (4 - 2) / 0.75 s; current = 8 / 0.5 s.
  EXPECT_TRUE(run_step(tp, t, 0.25));
  EXPECT_DOUBLE_EQ(*tp.avg_samples_per_sec(), 16.0 / 0.75);
  EXPECT_NEAR(*tp.curr_samples_per_sec(), 16.0, 1e-3);
  const std::string line =
      tp.report(static_cast<int64_t>(1.5 * kGiB), 2 * static_cast<int64_t>(kGiB));
  EXPECT_EQ(line.rfind("epoch=0/micro_step=8/global_step=4, RunningAvgSamplesPerSec="
                       "21.333333333333332, CurrSamplesPerSec=15.99996",
                       0),
            0u)
      << line;
  EXPECT_NE(line.find(", MemAllocated=1.5GB, MaxMemAllocated=2.0GB"), std::string::npos) << line;
  EXPECT_FALSE(run_step(tp, t, 0.25));
  EXPECT_TRUE(run_step(tp, t, 0.25));
  EXPECT_DOUBLE_EQ(*tp.avg_samples_per_sec(), 32.0 / 1.75);
  tp.update_epoch_count();
  EXPECT_EQ(tp.micro_step_count(), 0);
  EXPECT_EQ(tp.report(0, 0).rfind("epoch=1/micro_step=0/global_step=6,", 0), 0u);
}

TEST(ThroughputTimer, DisabledUnstartedOrWithoutStepsPerPrintItNeverReports) {
  FakeClock t;
  ThroughputTimerOptions off;
  off.enabled = false;
  off.steps_per_output = 1;
  ThroughputTimer disabled(off, t.clock());
  for (int s = 0; s < 4; ++s) EXPECT_FALSE(run_step(disabled, t, 0.5));
  EXPECT_EQ(disabled.global_step_count(), 0);
  EXPECT_FALSE(disabled.avg_samples_per_sec());

  ThroughputTimerOptions quiet;
  quiet.batch_size = 4;  // steps_per_output unset: DeepSpeed's default steps_per_print (None)
  ThroughputTimer tp(quiet, t.clock());
  for (int s = 0; s < 4; ++s) EXPECT_FALSE(run_step(tp, t, 0.5));
  EXPECT_DOUBLE_EQ(*tp.avg_samples_per_sec(), 4.0);

  // stop() without start() (the client never called the engine's forward) counts nothing.
  EXPECT_FALSE(tp.stop(true));
  EXPECT_EQ(tp.global_step_count(), 4);
  EXPECT_EQ(tp.report(0, 0).find("RunningAvgSamplesPerSec=4.0,") != std::string::npos, true);
}

TEST(ThroughputTimer, BeforeAnyTimedStepTheReportShowsMinusInfinityAsDeepSpeed) {
  FakeClock t;
  ThroughputTimer tp(ThroughputTimerOptions{}, t.clock());
  EXPECT_NE(tp.report(0, 0).find("RunningAvgSamplesPerSec=-inf,"), std::string::npos);
  ThroughputTimerOptions bad;
  bad.steps_per_output = 0;
  EXPECT_THROW_WITH(ThroughputTimer(bad, t.clock()), ConfigError, "steps_per_print");
}

}  // namespace
}  // namespace deepspeed::runtime

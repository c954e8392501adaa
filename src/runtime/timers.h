// Timers: DeepSpeed's utils/timer.py. `Timers` is the wall-clock breakdown (named timers summed
// until reset: micro timers such as fwd_microstep cover one micro-step, global timers such as fwd
// the micro-steps of one optimizer step) and formats DeepSpeed's "time (ms) | ..." line.
// `ThroughputTimer` is the samples/s meter behind the "RunningAvgSamplesPerSec=" line. Neither
// prints; the engine decides when a line is logged (see docs/observability.md).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace deepspeed::runtime {

/// A monotonic clock in seconds. Injectable so that tests drive time.
using Clock = std::function<double()>;
/// std::chrono::steady_clock in seconds.
double steady_clock_seconds();

/// Memory figures of DeepSpeed's timer line (its memory_usage()), in bytes. On CPU DeepSpeed's
/// accelerator reports the resident set for both allocated and cached memory.
struct TimerMemoryUsage {
  int64_t allocated_bytes = 0;
  int64_t max_allocated_bytes = 0;
  int64_t cached_bytes = 0;
  int64_t max_cached_bytes = 0;
};

/// " | mem_allocated: 0.1234 GB | max_mem_allocated: ... | cache_allocated: ... |
/// max_cache_allocated: ..." (GB = 2^30 bytes, 4 decimals), what DeepSpeed appends to a timer
/// line with memory_breakdown.
std::string format_memory_usage(const TimerMemoryUsage& memory);

class Timers {
 public:
  explicit Timers(Clock clock = steady_clock_seconds);

  /// Called before every clock read: a device synchronize when the work is asynchronous
  /// (DeepSpeed records CUDA events instead). Empty: nothing is called.
  void set_synchronize(std::function<void()> synchronize) { synchronize_ = std::move(synchronize); }

  /// Starts `name`, creating it on first use. Starting a running timer restarts its interval
  /// (DeepSpeed asserts; a forward that threw must not break every later step).
  void start(const std::string& name);
  /// Adds the running interval to `name`'s total. No-op when it is not running.
  void stop(const std::string& name);
  /// Whether `name` was ever started (DeepSpeed's `name in timers`).
  bool has(const std::string& name) const { return timers_.count(name) != 0; }
  /// Milliseconds accumulated since the last reset, including a running interval. 0 when unknown.
  double elapsed_ms(const std::string& name) const;
  /// Zeroes the total; a running timer keeps running from now.
  void reset(const std::string& name);

  /// DeepSpeed's SynchronizedWallClockTimer.log: "time (ms)" then " | name: 12.34" (elapsed /
  /// normalizer, 2 decimals) for each of `names` that was ever started, in that order; timers
  /// never started are skipped. `reset` zeroes the listed timers afterwards. With `memory`, its
  /// figures are appended (format_memory_usage). Throws UsageError when normalizer <= 0.
  std::string log(const std::vector<std::string>& names, double normalizer = 1.0,
                  bool reset = true,
                  const std::optional<TimerMemoryUsage>& memory = std::nullopt);

 private:
  struct Timer {
    double started_s = 0.0;
    bool running = false;
    double elapsed_ms = 0.0;
  };
  double now();

  Clock clock_;
  std::function<void()> synchronize_;
  std::map<std::string, Timer> timers_;
};

/// timers.throughput and the engine's batch figures.
struct ThroughputTimerOptions {
  bool enabled = true;                      // timers.throughput.enabled
  int64_t batch_size = 1;                   // samples per optimizer step (train_batch_size)
  int64_t start_step = 2;                   // DeepSpeed's warm-up: optimizer steps not timed
  std::optional<int64_t> steps_per_output;  // steps_per_print; nullopt: no report lines
};

/// DeepSpeed's ThroughputTimer. start() at the beginning of each micro-step (the engine's
/// forward), stop() at its end (the engine's step()). Once `start_step` optimizer steps are
/// done, every micro-step's start-to-stop time is added to the running total, so time spent
/// between micro-steps (data loading, logging) is not counted. Then
///   RunningAvgSamplesPerSec = batch_size * (global_steps - start_step) / total time
///   CurrSamplesPerSec       = batch_size / (seconds of the last optimizer step's micro-steps
///                                          + 1e-6)
class ThroughputTimer {
 public:
  /// `synchronize` runs before each clock read (timers.throughput.synchronized on a device).
  explicit ThroughputTimer(ThroughputTimerOptions options, Clock clock = steady_clock_seconds,
                           std::function<void()> synchronize = {});

  void start();
  /// Ends the micro-step begun by start() (no-op without one); `global_step` when it completes
  /// an optimizer step. Returns true when DeepSpeed prints its report now: an optimizer step
  /// that was timed and whose count is a multiple of steps_per_output.
  bool stop(bool global_step);
  /// DeepSpeed's line: "epoch=E/micro_step=M/global_step=G, RunningAvgSamplesPerSec=X,
  /// CurrSamplesPerSec=Y, MemAllocated=AGB, MaxMemAllocated=BGB" (Python float repr; memory in
  /// GB = 2^30 bytes rounded to 2 decimals).
  std::string report(int64_t mem_allocated_bytes, int64_t max_mem_allocated_bytes) const;

  /// nullopt until an optimizer step after the warm-up was timed.
  std::optional<double> avg_samples_per_sec() const;
  std::optional<double> curr_samples_per_sec() const { return curr_samples_per_sec_; }
  /// DeepSpeed counts epochs from its own data loader; a client calls this at each epoch end.
  void update_epoch_count() {
    epoch_count_ += 1;
    micro_step_count_ = 0;
  }
  int64_t micro_step_count() const { return micro_step_count_; }
  int64_t global_step_count() const { return global_step_count_; }

 private:
  double now();

  ThroughputTimerOptions options_;
  Clock clock_;
  std::function<void()> synchronize_;
  bool started_ = false;
  std::optional<double> start_s_;  // set once timing has begun (after the warm-up)
  int64_t epoch_count_ = 0;
  int64_t micro_step_count_ = 0;
  int64_t global_step_count_ = 0;
  double total_elapsed_s_ = 0.0;
  double step_elapsed_s_ = 0.0;
  std::optional<double> curr_samples_per_sec_;
};

}  // namespace deepspeed::runtime

// Timers and ThroughputTimer (see timers.h). Host clocks: on CPU that is the time the work
// took; on an asynchronous device the engine installs a synchronize hook.
#include "runtime/timers.h"

#include <chrono>
#include <cmath>
#include <cstdio>

#include "monitor/python_float.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

constexpr double kBytesPerGB = 1024.0 * 1024.0 * 1024.0;
// Matches DeepSpeed (TIME_EPSILON): keeps CurrSamplesPerSec finite for a zero-length step.
constexpr double kTimeEpsilonS = 1e-6;

// Python's round(x, 2) then repr: "0.29", "1.0".
std::string round2_repr(double x) {
  return monitor::detail::python_float_repr(std::round(x * 100.0) / 100.0);
}

}  // namespace

double steady_clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string format_memory_usage(const TimerMemoryUsage& m) {
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                " | mem_allocated: %.4f GB | max_mem_allocated: %.4f GB | cache_allocated: %.4f "
                "GB | max_cache_allocated: %.4f GB",
                m.allocated_bytes / kBytesPerGB, m.max_allocated_bytes / kBytesPerGB,
                m.cached_bytes / kBytesPerGB, m.max_cached_bytes / kBytesPerGB);
  return buf;
}

Timers::Timers(Clock clock) : clock_(std::move(clock)) {}

double Timers::now() {
  if (synchronize_) synchronize_();
  return clock_();
}

void Timers::start(const std::string& name) {
  Timer& t = timers_[name];
  t.started_s = now();
  t.running = true;
}

void Timers::stop(const std::string& name) {
  auto it = timers_.find(name);
  if (it == timers_.end() || !it->second.running) return;
  it->second.elapsed_ms += (now() - it->second.started_s) * 1e3;
  it->second.running = false;
}

double Timers::elapsed_ms(const std::string& name) const {
  auto it = timers_.find(name);
  if (it == timers_.end()) return 0.0;
  const Timer& t = it->second;
  // Matches DeepSpeed's elapsed(): a running timer counts up to now and keeps running.
  return t.elapsed_ms + (t.running ? (clock_() - t.started_s) * 1e3 : 0.0);
}

void Timers::reset(const std::string& name) {
  auto it = timers_.find(name);
  if (it == timers_.end()) return;
  it->second.elapsed_ms = 0.0;
  if (it->second.running) it->second.started_s = now();
}

std::string Timers::log(const std::vector<std::string>& names, double normalizer, bool reset,
                        const std::optional<TimerMemoryUsage>& memory) {
  DS_CHECK(normalizer > 0.0, UsageError, "Timers::log: normalizer must be > 0, got ",
           normalizer);
  if (synchronize_) synchronize_();
  std::string line = "time (ms)";
  char buf[64];
  for (const auto& name : names) {
    if (!has(name)) continue;
    std::snprintf(buf, sizeof(buf), "%.2f", elapsed_ms(name) / normalizer);
    line += " | " + name + ": " + buf;
    if (reset) this->reset(name);
  }
  if (memory) line += format_memory_usage(*memory);
  return line;
}

ThroughputTimer::ThroughputTimer(ThroughputTimerOptions options, Clock clock,
                                 std::function<void()> synchronize)
    : options_(options), clock_(std::move(clock)), synchronize_(std::move(synchronize)) {
  DS_CHECK(!options_.steps_per_output || *options_.steps_per_output > 0, ConfigError,
           "steps_per_print must be a positive integer, got ",
           options_.steps_per_output.value_or(0));
  if (options_.batch_size <= 0) options_.batch_size = 1;  // DeepSpeed: None counts as 1
}

double ThroughputTimer::now() {
  if (synchronize_) synchronize_();
  return clock_();
}

void ThroughputTimer::start() {
  if (!options_.enabled) return;
  started_ = true;
  if (global_step_count_ >= options_.start_step) start_s_ = now();
}

bool ThroughputTimer::stop(bool global_step) {
  if (!options_.enabled || !started_) return false;
  started_ = false;
  micro_step_count_ += 1;
  if (global_step) global_step_count_ += 1;
  if (!start_s_) return false;  // still warming up
  const double duration = now() - *start_s_;
  total_elapsed_s_ += duration;
  step_elapsed_s_ += duration;
  if (!global_step) return false;
  curr_samples_per_sec_ =
      static_cast<double>(options_.batch_size) / (step_elapsed_s_ + kTimeEpsilonS);
  step_elapsed_s_ = 0.0;
  return options_.steps_per_output && global_step_count_ % *options_.steps_per_output == 0;
}

std::optional<double> ThroughputTimer::avg_samples_per_sec() const {
  const int64_t timed_steps = global_step_count_ - options_.start_step;
  if (timed_steps <= 0 || total_elapsed_s_ <= 0.0) return std::nullopt;
  return static_cast<double>(options_.batch_size) / (total_elapsed_s_ / timed_steps);
}

std::string ThroughputTimer::report(int64_t mem_allocated_bytes,
                                    int64_t max_mem_allocated_bytes) const {
  using monitor::detail::python_float_repr;
  // DeepSpeed prints -inf before any optimizer step was timed.
  const double avg = avg_samples_per_sec().value_or(-INFINITY);
  const double curr = curr_samples_per_sec_.value_or(0.0);
  return "epoch=" + std::to_string(epoch_count_) + "/micro_step=" +
         std::to_string(micro_step_count_) + "/global_step=" + std::to_string(global_step_count_) +
         ", RunningAvgSamplesPerSec=" + python_float_repr(avg) +
         ", CurrSamplesPerSec=" + python_float_repr(curr) +
         ", MemAllocated=" + round2_repr(mem_allocated_bytes / kBytesPerGB) +
         "GB, MaxMemAllocated=" + round2_repr(max_mem_allocated_bytes / kBytesPerGB) + "GB";
}

}  // namespace deepspeed::runtime

// DeepSpeed's CurriculumScheduler (runtime/data_pipeline/curriculum_scheduler.py), computed the
// way it computes: doubles where it uses Python floats, Python's floor division and modulo.
#include "deepspeed/curriculum_scheduler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "util/check.h"

namespace deepspeed {
namespace {

// Python's // and % for a positive divisor: rounded towards minus infinity.
int64_t floor_div(int64_t a, int64_t b) { return a / b - ((a % b != 0 && a < 0) ? 1 : 0); }
int64_t floor_mod(int64_t a, int64_t b) { return a - floor_div(a, b) * b; }

}  // namespace

CurriculumScheduler::CurriculumScheduler(CurriculumLearningConfig config)
    : config_(std::move(config)), current_(config_.min_difficulty) {}

int64_t CurriculumScheduler::fixed_discrete_difficulty(int64_t global_steps) const {
  const auto& steps = config_.max_step;
  if (global_steps > steps.back()) return config_.difficulty.back();
  for (size_t i = 0; i < steps.size(); ++i) {
    if (global_steps <= steps[i]) return config_.difficulty[i];
  }
  return config_.difficulty.back();  // unreachable: steps.back() bounds global_steps
}

int64_t CurriculumScheduler::fixed_root_difficulty(int64_t global_steps,
                                                   double root_degree) const {
  const double progress =
      std::pow(static_cast<double>(global_steps) /
                   static_cast<double>(config_.total_curriculum_step),
               1.0 / root_degree);
  const int64_t lo = config_.min_difficulty;
  const int64_t hi = config_.max_difficulty;
  int64_t next = static_cast<int64_t>(
      std::floor(progress * static_cast<double>(hi - lo) + static_cast<double>(lo)));
  const int64_t step = config_.difficulty_step;
  next -= floor_mod(next, step);
  // Matches DeepSpeed: rounding down to a multiple of difficulty_step may fall below
  // min_difficulty (0 on the first step for min 8 and step 16: an empty sequence), so the floor
  // is the first multiple of the step at or above min_difficulty.
  next = std::max(next, -floor_div(-lo, step) * step);
  return std::min(next, hi);
}

int64_t CurriculumScheduler::get_difficulty(int64_t global_steps) const {
  const std::string& type = config_.schedule_type;
  if (type == "fixed_discrete") return fixed_discrete_difficulty(global_steps);
  if (type == "fixed_linear") return fixed_root_difficulty(global_steps, 1.0);
  if (type == "fixed_root") return fixed_root_difficulty(global_steps, config_.root_degree);
  DS_CHECK(type == "custom", ConfigError, "curriculum_learning.schedule_type is \"", type,
           "\"; expected fixed_linear, fixed_root, fixed_discrete or custom");
  DS_CHECK(static_cast<bool>(custom_), UsageError,
           "curriculum_learning.schedule_type is \"custom\" but no schedule was set: call "
           "engine.curriculum_scheduler_legacy()->set_custom_get_difficulty(fn) before training");
  return custom_(global_steps);
}

int64_t CurriculumScheduler::update_difficulty(int64_t global_steps) {
  if (current_ < config_.max_difficulty) current_ = get_difficulty(global_steps);
  return current_;
}

}  // namespace deepspeed

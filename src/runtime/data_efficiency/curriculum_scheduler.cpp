// DeepSpeed's CurriculumScheduler (runtime/data_pipeline/curriculum_scheduler.py), computed the
// way it computes: doubles where it uses Python floats, Python's floor division and modulo.
#include "deepspeed/curriculum_scheduler.h"

#include <utility>

#include "runtime/data_efficiency/fixed_root_schedule.h"
#include "util/check.h"

namespace deepspeed {

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
  return data_pipeline::fixed_root_value(global_steps, config_.total_curriculum_step,
                                           root_degree, config_.min_difficulty,
                                           config_.max_difficulty, config_.difficulty_step);
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

// DeepSpeed's CurriculumScheduler, as its legacy `curriculum_learning` section drives it: the
// difficulty (a sequence length, for curriculum_type "seqlen") for each global step, rising from
// min_difficulty to max_difficulty and never falling back. See docs/curriculum_learning.md.
#pragma once

#include <cstdint>
#include <functional>

#include "deepspeed/config.h"

namespace deepspeed {

class CurriculumScheduler {
 public:
  /// The schedule of an enabled section (DeepSpeedConfig validated its keys).
  explicit CurriculumScheduler(CurriculumLearningConfig config);

  /// The difficulty the last update_difficulty() chose (min_difficulty before the first).
  int64_t get_current_difficulty() const { return current_; }
  void set_current_difficulty(int64_t difficulty) { current_ = difficulty; }

  /// schedule_type "custom": the function from global step to difficulty (DeepSpeed's
  /// set_custom_get_difficulty). Required before the first training forward.
  void set_custom_get_difficulty(std::function<int64_t(int64_t)> schedule) {
    custom_ = std::move(schedule);
  }

  /// The schedule's difficulty at `global_steps`, without changing the current one.
  int64_t get_difficulty(int64_t global_steps) const;

  /// Moves the current difficulty to the schedule's at `global_steps` unless it has reached
  /// max_difficulty already; returns it. The engine calls this before each training forward
  /// with global_steps + 1.
  int64_t update_difficulty(int64_t global_steps);

  const CurriculumLearningConfig& config() const { return config_; }

  /// Whether no train_batch has run yet (the pipeline engine renegotiates its activation shapes
  /// on the first one and whenever the difficulty changes).
  bool first_step = true;

 private:
  int64_t fixed_discrete_difficulty(int64_t global_steps) const;
  int64_t fixed_root_difficulty(int64_t global_steps, double root_degree) const;

  CurriculumLearningConfig config_;
  int64_t current_;
  std::function<int64_t(int64_t)> custom_;
};

}  // namespace deepspeed

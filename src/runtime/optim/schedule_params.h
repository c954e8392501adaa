// Reading scheduler.params the way DeepSpeed's schedule constructors take their keyword
// arguments: defaults, "float or list" per-group values (lr_schedules.py's _format_param), and
// an error naming any key the schedule does not take.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::optim::detail {

/// A "float or list" parameter: one value for every group, or one per group.
struct PerGroup {
  std::vector<double> values;
  double at(size_t group) const { return values.size() == 1 ? values[0] : values.at(group); }
};

class ScheduleParams {
 public:
  /// `num_groups` 0: list lengths are not checked (config-time check; no warnings either).
  ScheduleParams(const json& params, const std::string& source, size_t num_groups);

  /// Absent and null read as unset; "auto" is a ConfigError naming the key.
  const json* raw(const std::string& key);
  double number(const std::string& key, double fallback);
  std::optional<double> opt_number(const std::string& key);
  int64_t positive_int(const std::string& key, int64_t fallback);
  bool boolean(const std::string& key, bool fallback);
  /// "log" or "linear"; anything else warns and reads as "log", as DeepSpeed does.
  bool warmup_is_log(const std::string& key);
  PerGroup per_group(const std::string& key, double fallback);
  std::optional<PerGroup> opt_per_group(const std::string& key);
  /// Throws ConfigError naming a key of params that no reader asked for.
  void finish(const std::string& type);

  /// "<source>: scheduler.params.<key>" for messages.
  std::string where(const std::string& key) const { return base_ + key; }
  /// Prints a warning unless this is a config-time check.
  void warn(const std::string& message) const;

 private:
  const json& params_;
  std::string base_;
  size_t num_groups_;
  std::vector<std::string> known_;
};

}  // namespace deepspeed::optim::detail

#include "deepspeed/lr_schedules.h"

namespace deepspeed::optim::detail {

/// OneCycle's schedule (one_cycle.cpp) from its parameters.
LrSchedule one_cycle_schedule(ScheduleParams& params);

}  // namespace deepspeed::optim::detail

// DeepSpeed's LR schedules (runtime/lr_schedules.py) as pure functions of the iteration k, plus
// LRScheduler, which writes them into an optimizer's param groups.
// Matches DeepSpeed: k starts at -1 and the value for k=-1 is written at construction; step()
// does k += 1 and writes lr(k). The engine steps the scheduler after the optimizer, so update n
// (0-based) trains with lr(n-1).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::optim {

/// lr as a function of k for one param group whose configured (base) lr is `base_lr`.
using LrFunction = std::function<double(int64_t k, double base_lr)>;

/// Throws ConfigError / NotSupportedError for a scheduler section this build cannot run.
void check_scheduler_supported(const SchedulerConfig& config, const std::string& source);

/// The schedule named by `config` (WarmupLR, WarmupDecayLR, WarmupCosineLR, LRRangeTest).
LrFunction make_lr_function(const SchedulerConfig& config, const std::string& source);

/// Applies an LrFunction to a set of param groups through getter/setter callbacks, so that it
/// works with any optimizer (torch::optim today, our fused ones later).
class LRScheduler {
 public:
  /// `base_lrs` are the groups' lrs at construction; `set_lr(group, lr)` writes one group.
  LRScheduler(LrFunction fn, std::vector<double> base_lrs,
              std::function<void(size_t, double)> set_lr);

  /// k += 1, then writes lr(k) into every group.
  void step();
  /// The lrs last written, one per group (DeepSpeed's get_last_lr()).
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  int64_t last_batch_iteration() const { return last_batch_iteration_; }

  /// {"last_batch_iteration": k}, DeepSpeed's scheduler state.
  json state_dict() const;
  void load_state_dict(const json& state);

 private:
  void apply();

  LrFunction fn_;
  std::vector<double> base_lrs_;
  std::function<void(size_t, double)> set_lr_;
  std::vector<double> last_lrs_;
  int64_t last_batch_iteration_ = -1;
};

}  // namespace deepspeed::optim

// DeepSpeed's LR schedules (runtime/lr_schedules.py: WarmupLR, WarmupDecayLR, WarmupCosineLR,
// LRRangeTest, OneCycle) as pure functions of the iteration k, plus LRScheduler, which writes
// them into an optimizer's param groups.
// Matches DeepSpeed: k starts at -1 and the value for k=-1 is written at construction; step()
// does k += 1 and writes lr(k). The engine steps the scheduler after the optimizer, so update n
// (0-based) trains with lr(n-1).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "deepspeed/config.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::optim {

/// What a schedule writes, as functions of k and the param group.
struct LrSchedule {
  /// lr of param group `group` at iteration k; `base_lr` is the group's lr when the scheduler
  /// was built (WarmupLR without warmup_max_lr and WarmupCosineLR scale it).
  std::function<double(int64_t k, size_t group, double base_lr)> lr;
  /// (beta1, beta2) of group `group` at k, for schedules that cycle momentum (OneCycle with
  /// cycle_momentum); empty otherwise.
  std::function<std::pair<double, double>(int64_t k, size_t group)> betas;
};

/// The schedule named by `config` for an optimizer with `num_groups` param groups. A parameter
/// documented as "float or list" (warmup_min_lr, warmup_max_lr, lr_range_test_min_lr,
/// cycle_min_lr, cycle_max_lr, cycle_min_mom, cycle_max_mom) may be a list with one value per
/// group; num_groups 0 accepts any length (config-time check).
/// Throws ConfigError naming the key (unknown key, bad value, missing required key, "expected N
/// values for X, got M") and NotSupportedError for torch.optim.lr_scheduler classes.
LrSchedule make_lr_schedule(const SchedulerConfig& config, size_t num_groups,
                            const std::string& source);

/// Throws what make_lr_schedule would for `config` itself.
void check_scheduler_supported(const SchedulerConfig& config, const std::string& source);

/// lr as a function of k for one param group whose configured (base) lr is `base_lr`.
using LrFunction = std::function<double(int64_t k, double base_lr)>;

/// The lr part of the schedule, for one param group (or several sharing scalar parameters).
/// Deprecated: use make_lr_scheduler, which also cycles momentum and takes per-group lists;
/// this warns when the schedule would cycle momentum.
LrFunction make_lr_function(const SchedulerConfig& config, const std::string& source);

/// Applies a schedule to a set of param groups through setter callbacks, so that it works with
/// any optimizer.
class LRScheduler {
 public:
  using LrSetter = std::function<void(size_t group, double lr)>;
  using BetasSetter = std::function<void(size_t group, double beta1, double beta2)>;

  /// `base_lrs` are the groups' lrs at construction; `set_lr(group, lr)` writes one group, and
  /// `set_betas` its (beta1, beta2) when the schedule cycles momentum (when it is empty, the
  /// schedule's momentum is not applied). Writes the values for k = -1.
  LRScheduler(LrSchedule schedule, std::vector<double> base_lrs, LrSetter set_lr,
              BetasSetter set_betas = nullptr);
  /// An lr-only schedule.
  LRScheduler(LrFunction fn, std::vector<double> base_lrs, LrSetter set_lr);

  /// k += 1, then writes lr(k) (and betas(k)) into every group.
  void step();
  /// The lrs last written, one per group (DeepSpeed's get_last_lr()).
  const std::vector<double>& get_last_lr() const { return last_lrs_; }
  /// The (beta1, beta2) last written, one per group; empty when momentum is not scheduled.
  const std::vector<std::pair<double, double>>& get_last_betas() const { return last_betas_; }
  /// Whether step() writes momentum (beta1, beta2).
  bool cycles_momentum() const { return schedule_.betas && set_betas_; }
  int64_t last_batch_iteration() const { return last_batch_iteration_; }

  /// {"last_batch_iteration": k}, DeepSpeed's scheduler state.
  json state_dict() const;
  /// Restores k and writes lr(k) (and betas(k)) at once, the values the optimizer had when the
  /// state was saved. Throws CheckpointError for a dict without an integer k.
  void load_state_dict(const json& state);

 private:
  void apply();

  LrSchedule schedule_;
  std::vector<double> base_lrs_;
  LrSetter set_lr_;
  BetasSetter set_betas_;
  std::vector<double> last_lrs_;
  std::vector<std::pair<double, double>> last_betas_;
  int64_t last_batch_iteration_ = -1;
};

/// The scheduler named by `config` over `optimizer`'s param groups (ours from
/// deepspeed/optimizers.h, or any torch::optim optimizer): lr through the groups' set_lr, and
/// for OneCycle (beta1, beta2) through set_betas. As in DeepSpeed, momentum cycling is disabled
/// with a warning when the optimizer has no betas (SGD, Adagrad). `optimizer` must outlive the
/// scheduler. Throws as make_lr_schedule.
std::unique_ptr<LRScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               torch::optim::Optimizer& optimizer,
                                               const std::string& source);

}  // namespace deepspeed::optim

// make_lr_scheduler: binds a schedule to an optimizer's param groups (lr, and beta1/beta2 for
// OneCycle), for our optimizers and torch::optim's.
#include "runtime/optim/lr_scheduler_factory.h"

#include <typeinfo>

#include <torch/optim/optimizer.h>

#include "deepspeed/lr_schedules.h"
#include "deepspeed/optimizers.h"
#include "util/logging.h"

namespace deepspeed::optim {

std::unique_ptr<LRScheduler> make_lr_scheduler(const SchedulerConfig& config,
                                               torch::optim::Optimizer& optimizer,
                                               const std::string& source) {
  return bind_lr_schedule(make_lr_schedule(config, optimizer.param_groups().size(), source),
                          optimizer, config.type, source);
}

std::unique_ptr<LRScheduler> bind_lr_schedule(LrSchedule schedule,
                                              torch::optim::Optimizer& optimizer,
                                              const std::string& type, const std::string& source) {
  auto& groups = optimizer.param_groups();
  std::vector<double> base_lrs;
  for (const auto& g : groups) base_lrs.push_back(g.options().get_lr());

  LRScheduler::LrSetter set_lr = [&optimizer](size_t g, double lr) {
    optimizer.param_groups()[g].options().set_lr(lr);
  };
  LRScheduler::BetasSetter set_group_betas;
  if (schedule.betas) {
    // Matches DeepSpeed: cycling needs 'betas' in the optimizer's defaults, else it is disabled.
    if (get_betas(optimizer.defaults())) {
      set_group_betas = [&optimizer](size_t g, double beta1, double beta2) {
        set_betas(optimizer.param_groups()[g].options(), beta1, beta2);
      };
    } else {
      const auto* ds = dynamic_cast<const DsOptimizer*>(&optimizer);
      log::warn_rank0(source + ": scheduler " + type +
                      ": cycle_momentum is disabled because optimizer " +
                      (ds ? ds->type_name() : std::string(typeid(optimizer).name())) +
                      " has no betas");
      schedule.betas = nullptr;
    }
  }
  return std::make_unique<LRScheduler>(std::move(schedule), std::move(base_lrs), std::move(set_lr),
                                       std::move(set_group_betas));
}

}  // namespace deepspeed::optim

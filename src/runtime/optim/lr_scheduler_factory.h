// Binding a schedule to an optimizer's param groups, for schedules built other than from a
// config's scheduler section alone (dynamic batching rescales one).
#pragma once

#include <memory>
#include <string>

#include "deepspeed/lr_schedules.h"

namespace deepspeed::optim {

/// An LRScheduler writing `schedule` into `optimizer`'s groups, as make_lr_scheduler does:
/// momentum cycling is dropped with a warning naming `type` when the optimizer has no betas.
std::unique_ptr<LRScheduler> bind_lr_schedule(LrSchedule schedule,
                                              torch::optim::Optimizer& optimizer,
                                              const std::string& type, const std::string& source);

}  // namespace deepspeed::optim

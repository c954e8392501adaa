// Dynamic batching's learning rate: DeepSpeed's VariableBatchSizeLR over the engine's schedule.
// The engine builds its scheduler through make_variable_batch_lr_scheduler when the config
// enables dynamic batching; make_variable_batch_loader later fills in the batch sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "deepspeed/lr_schedules.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed {
class Engine;
}

namespace deepspeed::data_sampling {

/// The scaling of the engine's rates: batch n's sequences against base_batch_size.
struct VariableBatchLr {
  int64_t base_batch_size = 1;
  std::string method = "linear";
  std::vector<int64_t> batch_sizes;  // empty until a loader exists: no scaling

  /// The factor for optimizer step n (0-based), cycling through the batches.
  double factor(int64_t step) const;
};

/// The engine's scheduler under dynamic batching: the config's schedule (or the optimizer's
/// constant rates when the config has none) where update n (0-based; the scheduler's k = n-1)
/// trains with the schedule's value for k = n scaled by factor(n). DeepSpeed's wrapper steps
/// its base schedule once at construction, hence the schedule one step ahead.
std::unique_ptr<optim::LRScheduler> make_variable_batch_lr_scheduler(
    const Engine& engine, torch::optim::Optimizer& optimizer);

/// The scaling state of `engine`'s scheduler; null when its scheduler was not built by
/// make_variable_batch_lr_scheduler (or the engine is gone).
std::shared_ptr<VariableBatchLr> engine_variable_batch_lr(const Engine& engine);

}  // namespace deepspeed::data_sampling

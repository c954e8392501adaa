// Dynamic batching's learning rate: DeepSpeed's VariableBatchSizeLR over the engine's schedule.
// The engine builds its scheduler through make_variable_batch_lr_scheduler when the config
// enables dynamic batching; make_variable_batch_loader later fills in the batch sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  std::vector<double> base_lrs;      // the groups' configured rates

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

/// `scheduler`'s checkpoint state as DeepSpeed's VariableBatchSizeLR saves it, so that either
/// side resumes the other's: {"base_lr_scheduler": {"last_batch_iteration": n},
/// "base_batch_size", "lr_scaling_method", "batch_sizes", "base_lrs", "last_epoch": n,
/// "verbose"}, n the updates taken (the wrapper and its base schedule both count them; this
/// scheduler's k is n - 1).
nlohmann::json variable_batch_lr_state_dict(const VariableBatchLr& lr,
                                            const optim::LRScheduler& scheduler);

/// The state LRScheduler::load_state_dict takes, from either form: DeepSpeed's wrapper's
/// (last_epoch n -> last_batch_iteration n - 1) or the plain one. Throws CheckpointError naming
/// `where` for a wrapper state without an integer last_epoch.
nlohmann::json scheduler_state_from_variable_batch(const nlohmann::json& state,
                                                   const std::string& where);

}  // namespace deepspeed::data_sampling

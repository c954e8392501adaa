#include "runtime/data_efficiency/variable_batch_lr.h"

#include <map>
#include <mutex>

#include <torch/optim/optimizer.h>

#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/variable_batch.h"
#include "runtime/optim/lr_scheduler_factory.h"
#include "util/check.h"

namespace deepspeed::data_sampling {
namespace {

// Engine -> its scheduler's scaling state. Weak: the scheduler owns the state, so an engine
// that is gone (or a later one at its address without dynamic batching) finds nothing.
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<const Engine*, std::weak_ptr<VariableBatchLr>>& registry() {
  static std::map<const Engine*, std::weak_ptr<VariableBatchLr>> r;
  return r;
}

}  // namespace

double VariableBatchLr::factor(int64_t step) const {
  if (batch_sizes.empty()) return 1.0;
  const auto n = static_cast<int64_t>(batch_sizes.size());
  const int64_t batch = batch_sizes[static_cast<size_t>(((step % n) + n) % n)];
  return scale_lr(base_batch_size, batch, 1.0, method);
}

std::unique_ptr<optim::LRScheduler> make_variable_batch_lr_scheduler(
    const Engine& engine, torch::optim::Optimizer& optimizer) {
  const DeepSpeedConfig& config = engine.config();
  optim::LrSchedule base;
  if (config.scheduler.present) {
    base = optim::make_lr_schedule(config.scheduler, optimizer.param_groups().size(),
                                   config.source);
  } else {
    base.lr = [](int64_t, size_t, double base_lr) { return base_lr; };  // a constant rate
  }
  auto state = std::make_shared<VariableBatchLr>();
  for (const auto& g : optimizer.param_groups()) state->base_lrs.push_back(g.options().get_lr());
  optim::LrSchedule scaled;
  scaled.lr = [base_lr = base.lr, state](int64_t k, size_t group, double lr0) {
    return base_lr(k + 1, group, lr0) * state->factor(k + 1);
  };
  if (base.betas) {
    scaled.betas = [betas = base.betas](int64_t k, size_t group) { return betas(k + 1, group); };
  }
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    registry()[&engine] = state;
  }
  return optim::bind_lr_schedule(std::move(scaled), optimizer,
                                 config.scheduler.present ? config.scheduler.type : "constant",
                                 config.source);
}

std::shared_ptr<VariableBatchLr> engine_variable_batch_lr(const Engine& engine) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(&engine);
  return it == registry().end() ? nullptr : it->second.lock();
}

nlohmann::json variable_batch_lr_state_dict(const VariableBatchLr& lr,
                                            const optim::LRScheduler& scheduler) {
  const int64_t updates = scheduler.last_batch_iteration() + 1;
  return {{"base_lr_scheduler", {{"last_batch_iteration", updates}}},
          {"base_batch_size", lr.base_batch_size},
          {"lr_scaling_method", lr.method},
          {"batch_sizes", lr.batch_sizes},
          {"base_lrs", lr.base_lrs},
          {"last_epoch", updates},
          {"verbose", false}};
}

nlohmann::json scheduler_state_from_variable_batch(const nlohmann::json& state,
                                                   const std::string& where) {
  if (!state.is_object() || !state.contains("base_lr_scheduler")) return state;
  DS_CHECK(state.contains("last_epoch") && state["last_epoch"].is_number_integer(), CheckpointError,
           where, ": a VariableBatchSizeLR state without an integer 'last_epoch'");
  return {{"last_batch_iteration", state["last_epoch"].get<int64_t>() - 1}};
}

}  // namespace deepspeed::data_sampling

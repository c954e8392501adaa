// DeepSpeed's RandomLTDScheduler (runtime/data_pipeline/data_routing/scheduler.py): its
// fixed_linear schedule is the curriculum's fixed_root of degree 1 (fixed_root_schedule.h).
#include <utility>

#include "deepspeed/random_ltd.h"
#include "runtime/data_efficiency/fixed_root_schedule.h"
#include "util/check.h"

namespace deepspeed {

RandomLtdScheduler::RandomLtdScheduler(RandomLtdConfig config, int64_t global_batch_size)
    : config_(std::move(config)),
      global_batch_size_(global_batch_size),
      min_value_(config_.min_value),
      max_value_(config_.max_value),
      current_value_(config_.min_value) {}

int64_t RandomLtdScheduler::get_value(int64_t global_steps) const {
  return data_pipeline::fixed_root_value(global_steps, config_.require_steps, /*root_degree=*/1,
                                           min_value_, max_value_, config_.seq_per_step);
}

void RandomLtdScheduler::update_seq(int64_t global_steps) {
  if (current_value_ < max_value_) current_value_ = get_value(global_steps);
  if (global_steps != current_step_) {
    const int64_t dropping = config_.random_ltd_layer_num;
    consumed_layer_tokens_ +=
        global_batch_size_ * (current_value_ * dropping +
                              max_value_ * (config_.total_layer_num - dropping));
    current_step_ = global_steps;
  }
}

int64_t RandomLtdScheduler::get_total_layer_tokens(int64_t train_iters) const {
  RandomLtdScheduler fresh(config_, global_batch_size_);
  for (int64_t step = 0; step < train_iters; ++step) fresh.update_seq(step);
  return fresh.consumed_layer_tokens();
}

nlohmann::json RandomLtdScheduler::state_dict() const {
  return {{"consumed_layer_tokens", consumed_layer_tokens_},
          {"current_steps", current_step_},
          {"current_value", current_value_},
          {"min_value", min_value_},
          {"max_value", max_value_}};
}

void RandomLtdScheduler::load_state_dict(const nlohmann::json& state, const std::string& source) {
  auto take = [&](const char* key) {
    DS_CHECK(state.is_object() && state.contains(key) && state.at(key).is_number_integer(),
             CheckpointError, source, ": random_ltd state has no integer '", key, "'");
    return state.at(key).get<int64_t>();
  };
  const int64_t consumed = take("consumed_layer_tokens");
  const int64_t step = take("current_steps");
  const int64_t current = take("current_value");
  const int64_t lo = take("min_value");
  const int64_t hi = take("max_value");
  consumed_layer_tokens_ = consumed;
  current_step_ = step;
  current_value_ = current;
  min_value_ = lo;
  max_value_ = hi;
}

}  // namespace deepspeed

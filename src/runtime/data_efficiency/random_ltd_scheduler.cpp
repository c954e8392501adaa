// DeepSpeed's RandomLTDScheduler (runtime/data_pipeline/data_routing/scheduler.py), computed the
// way it computes: a double for the progress, integers for the rest (global steps and lengths
// are never negative, so C++'s division and modulo are Python's).
#include <algorithm>
#include <cmath>
#include <utility>

#include "deepspeed/random_ltd.h"
#include "util/check.h"

namespace deepspeed {

RandomLtdScheduler::RandomLtdScheduler(RandomLtdConfig config, int64_t global_batch_size)
    : config_(std::move(config)),
      global_batch_size_(global_batch_size),
      min_value_(config_.min_value),
      max_value_(config_.max_value),
      current_value_(config_.min_value) {}

int64_t RandomLtdScheduler::get_value(int64_t global_steps) const {
  const double progress =
      static_cast<double>(global_steps) / static_cast<double>(config_.require_steps);
  int64_t next = static_cast<int64_t>(std::floor(
      progress * static_cast<double>(max_value_ - min_value_) + static_cast<double>(min_value_)));
  const int64_t step = config_.seq_per_step;
  next -= next % step;
  // Matches DeepSpeed: rounding down never takes the kept length below min_value's multiple.
  next = std::max(next, (min_value_ + step - 1) / step * step);
  return std::min(next, max_value_);
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

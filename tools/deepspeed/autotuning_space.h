// What the autotuner tries, as pure functions (unit-tested): the micro-batch sizes of a stage,
// the ZeRO knob space of a stage with the user's fixed keys removed and configurations that
// behave identically merged, the memory prediction from the engine's formula and the model-info
// run, and the order in which a tuner visits a space (gridsearch, random, model_based).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace deepspeed::launcher {

/// DeepSpeed's get_tuning_micro_batch_size_list: up to `num` sizes from max(min, max/2) to max
/// with a constant stride, skipping sizes whose gradient accumulation (max_tbs_per_gpu / mbs)
/// equals the largest size's; always ends with `max`. Empty when min or max is not positive.
std::vector<int64_t> tuning_micro_batch_sizes(int64_t min_mbs, int64_t max_mbs, int64_t num,
                                              int64_t max_train_batch_size_per_gpu);

/// DeepSpeed's default tuning space of a stage (autotuning/constants.py), as lists of values per
/// zero_optimization key.
nlohmann::json default_zero_tuning_space(int64_t stage);

/// The knob configurations of `stage` to try: every combination of the default space's values,
/// without the keys the user set in `user_zero` (fixed, as DeepSpeed's replace_dict does), without
/// keys this engine does not read at this stage (allgather_* at stage 3), and with configurations
/// that behave alike merged: a bucket of at least `num_params` elements holds every gradient, so
/// all such sizes are one (the smallest is kept). Each entry is a zero_optimization object to merge.
std::vector<nlohmann::json> zero_knob_configs(int64_t stage, const nlohmann::json& user_zero, int64_t num_params);

/// What the model-information run measured (autotuning_model_info.json).
struct ModelInfo {
  int64_t num_params = 0;
  int64_t largest_param_numel = 0;
  int64_t activation_bytes_per_sample = 0;
  int64_t peak_bytes = 0;          // peak memory of the profile run's steps (every rank's max)
  bool on_cpu = true;              // "device" of the profile run (cpu when not recorded)
  nlohmann::json profile_config;   // the config it ran with
  static ModelInfo from_json(const nlohmann::json& info, const nlohmann::json& profile_config);
};

/// Memory per rank predicted for a configuration: the engine's formula for its model states
/// (src/runtime/memory_formula.h, the one the memory report prints), the measured activation
/// bytes per sample, and the rest of the process (buffers, workspaces) calibrated on the
/// model-information run, whose own prediction is therefore exact.
class MemoryPredictor {
 public:
  MemoryPredictor(ModelInfo info, int64_t dp_world_size);
  /// Peak bytes per rank for a full config (the batch triad must be resolvable for the world).
  int64_t predict(const nlohmann::json& ds_config) const;
  /// The model states alone (the formula), without activations or the calibrated rest.
  int64_t model_state_bytes(const nlohmann::json& ds_config) const;
  /// The largest micro-batch whose prediction fits `budget` (0 when not even 1 fits).
  int64_t max_micro_batch(const nlohmann::json& ds_config, int64_t budget) const;
  int64_t overhead_bytes() const { return overhead_; }
  const ModelInfo& info() const { return info_; }

 private:
  ModelInfo info_;
  int64_t dp_world_size_;
  int64_t overhead_ = 0;
};

/// The order in which a tuner visits `n` configurations; `measured` gives the metric of those
/// already run (higher is better), so model_based can fit a cost model on them.
class TunerOrder {
 public:
  TunerOrder(std::string type, std::vector<nlohmann::json> configs, uint64_t seed = 0);
  /// The index of the next configuration to run, or nullopt when every one has been run.
  std::optional<size_t> next(const std::vector<std::pair<size_t, double>>& measured);

 private:
  std::string type_;
  std::vector<nlohmann::json> configs_;
  std::vector<size_t> order_;  // gridsearch: 0..n-1; random: a shuffle
  std::vector<bool> done_;
};

}  // namespace deepspeed::launcher

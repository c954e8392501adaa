// The `autotuning` section of ds_config.json (DeepSpeed's autotuning/config.py, constants.py), with
// DeepSpeed's keys and defaults. Read by the engine (profile steps, metric and model-info files)
// and by `deepspeed --autotuning tune|run` (the search itself, tools/deepspeed/autotuner*.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace deepspeed {

/// `autotuning.model_info`: what the user already knows about the model (skips the profile run
/// when num_params is given) or, with `profile`, the engine's model-information run.
struct AutotuningModelInfoConfig {
  bool profile = false;                   // the engine writes model info after one step, then exits
  std::optional<int64_t> num_params;      // parameters of the whole model
  std::optional<int64_t> hidden_size;     // sizes the stage-3 bucket/prefetch templates
  std::optional<int64_t> num_layers;
};

struct AutotuningConfig {
  bool enabled = false;
  bool fast = true;                                   // tune the micro-batch size per stage only
  std::string results_dir = "autotuning_results";     // summary, ds_config_optimal.json, cmd_optimal.txt
  std::string exps_dir = "autotuning_exps";           // one folder per experiment
  bool overwrite = true;                              // clear both folders first
  int64_t start_profile_step = 3;                     // first optimizer step measured (1-based)
  int64_t end_profile_step = 5;                       // last one: the engine writes the metric and exits
  std::string metric_path;                            // "" => ./autotuning_metric.json
  std::string metric = "throughput";                  // throughput | latency | flops
  std::string tuner_type = "gridsearch";              // gridsearch | random | model_based
  int64_t tuner_early_stopping = 5;                   // stop after this many trials without a better one
  int64_t tuner_num_trials = 50;                      // at most this many trials per tuning space
  std::map<std::string, std::string> arg_mappings;    // ds_config key -> the program's flag
  std::optional<int64_t> max_train_batch_size;
  int64_t min_train_batch_size = 1;
  int64_t max_train_micro_batch_size_per_gpu = 1024;
  int64_t min_train_micro_batch_size_per_gpu = 1;
  int64_t num_tuning_micro_batch_sizes = 3;
  int64_t mp_size = 1;                                // model-parallel degree of the job
  std::optional<AutotuningModelInfoConfig> model_info;
  std::string model_info_path;                        // "" => ./autotuning_model_info.json

  /// Parses the section alone (`section` may be null: every default). Unknown keys and bad
  /// values are ConfigError naming "<source>: autotuning.<key>".
  static AutotuningConfig from_json(const nlohmann::json* section, const std::string& source = "ds_config");
  /// The section of a parsed config (read again from its raw JSON; DeepSpeedConfig::from_json
  /// has already checked it).
  template <typename Config>
  static AutotuningConfig of(const Config& config) {
    const auto it = config.raw.find("autotuning");
    return from_json(it == config.raw.end() ? nullptr : &*it, config.source);
  }
  /// The section as JSON, every key with its value (the resolved config, the tuner's files).
  nlohmann::json to_json() const;
  /// metric_path / model_info_path with DeepSpeed's defaults in the working directory.
  std::string metric_file() const { return metric_path.empty() ? "autotuning_metric.json" : metric_path; }
  std::string model_info_file() const {
    return model_info_path.empty() ? "autotuning_model_info.json" : model_info_path;
  }
  bool profile_model_info() const { return enabled && model_info && model_info->profile; }
};

}  // namespace deepspeed

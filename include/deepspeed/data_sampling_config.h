// data_efficiency.data_sampling as read from ds_config.json (torch-free: the launcher's config
// reader compiles it too). The sampler that uses it: data_sampling.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::data_sampling {

/// One entry of curriculum_learning.curriculum_metrics.
struct CurriculumMetricConfig {
  std::string name;
  std::string index_to_sample_path;  // DataAnalyzer's *_index_to_sample(_percentile_merged)
  std::string index_to_metric_path;  // DataAnalyzer's *_index_to_metric (value-based only)
  std::string difficulty_type;       // "value" | "percentile"
  std::string clustering_type;       // "schedule_based" | "single_cluster"
  CurriculumLearningConfig schedule;  // min/max_difficulty, schedule_type, schedule_config
};

/// data_efficiency.data_sampling, with DeepSpeed's defaults.
struct DataSamplingConfig {
  bool enabled = false;
  int64_t num_epochs = 1000;
  int64_t seed = 1234;  // data_efficiency.seed
  bool curriculum_enabled = false;
  std::string data_cluster_path;
  std::vector<CurriculumMetricConfig> metrics;  // by name (JSON objects are read sorted)
};

/// The section as DeepSpeedConfig validated it at load (read again from its raw JSON).
DataSamplingConfig data_sampling_config(const DeepSpeedConfig& config);

}  // namespace deepspeed::data_sampling

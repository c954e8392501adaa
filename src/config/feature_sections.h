// Parsing of the feature sections that do not drive the ZeRO-0 engine yet (activation
// checkpointing, flops profiler, aio, pipeline, data types, elasticity, progressive layer drop,
// torch autocast) and of the sections of features this build lacks (unimplemented_sections.cpp):
// typed, with DeepSpeed's defaults, so that they are validated and refusable; and the refusal
// itself (supported_features.cpp).
#pragma once

#include "config/json_reader.h"
#include "deepspeed/compression_config.h"
#include "deepspeed/config.h"
#include "deepspeed/data_sampling_config.h"
#include "deepspeed/dynamic_batching_config.h"
#include "deepspeed/sparse_attention_config.h"

namespace deepspeed::config_detail {

/// Reads those sections from `top` into `c` (warnings go to c.warnings).
void parse_feature_sections(ConfigReader& top, DeepSpeedConfig& c);

/// Reads the legacy curriculum_learning section (curriculum_learning_section.cpp).
void parse_curriculum_learning(ConfigReader& top, DeepSpeedConfig& c);
void resolve_curriculum_learning(const DeepSpeedConfig& c, json& out);
/// The keys of a CurriculumScheduler in section `r` (min_difficulty, max_difficulty,
/// schedule_type, schedule_config), each required `why` (the legacy section's and each of
/// data_sampling's curriculum_metrics).
void parse_curriculum_schedule(ConfigReader& r, CurriculumLearningConfig& cl,
                               std::vector<std::string>& warnings, const std::string& why);

/// Reads the hybrid_engine section (hybrid_engine_section.cpp).
void parse_hybrid_engine(ConfigReader& top, DeepSpeedConfig& c);
void resolve_hybrid_engine(const DeepSpeedConfig& c, json& out);

/// Reads the data_efficiency section (data_efficiency_section.cpp).
void parse_data_efficiency(ConfigReader& top, DeepSpeedConfig& c);
/// Reads de's data_sampling section (data_sampling_section.cpp); `seed`: data_efficiency.seed.
data_sampling::DataSamplingConfig read_data_sampling(ConfigReader& de, int64_t seed,
                                                     std::vector<std::string>& warnings);
/// Reads data_sampling's dynamic_batching section (dynamic_batching_section.cpp).
data_sampling::DynamicBatchingConfig read_dynamic_batching(ConfigReader& data_sampling,
                                                           int64_t seed);
void resolve_data_efficiency(const DeepSpeedConfig& c, json& out);

/// Reads compression_training (compression_section.cpp); what this build lacks of it is added
/// to `unimplemented`.
compression::CompressionConfig read_compression_training(ConfigReader& top,
                                                        std::vector<std::string>& unimplemented);

/// Reads sparse_attention (sparse_attention_section.cpp); nullopt when absent.
std::optional<sparse_attention::SparseAttentionConfig> read_sparse_attention(ConfigReader& top);

/// Reads the sections of features this build does not implement (amp, compression_training,
/// compile, tensor_parallel, ...) far enough to fill c.unimplemented_requests.
void parse_unimplemented_sections(ConfigReader& top, DeepSpeedConfig& c);

/// Throws NotSupportedError naming the first configured feature this build lacks (the part of
/// DeepSpeedConfig::check_supported() that needs no optimizer code).
void check_features_supported(const DeepSpeedConfig& c);

/// Their resolved JSON, merged into DeepSpeedConfig::resolved().
void resolve_feature_sections(const DeepSpeedConfig& c, json& out);

}  // namespace deepspeed::config_detail

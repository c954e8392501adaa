// Sections of features this build does not implement: read only far enough to know whether they
// ask for the feature, with every key that decides it type-checked, so that check_supported()
// refuses an enabled feature by name and a disabled section passes. Their other keys are kept
// verbatim in DeepSpeedConfig::raw.
#include "config/feature_sections.h"
#include "config/expert_parallel_section.h"
#include "config/tensor_parallel_section.h"

namespace deepspeed::config_detail {
namespace {

// Sections switched on by "enabled": true (DeepSpeed's default is false for each).
constexpr const char* kEnabledSections[] = {"amp", "nebula", "datastates", "eigenvalue"};

}  // namespace

void parse_unimplemented_sections(ConfigReader& top, DeepSpeedConfig& c) {
  auto& on = c.unimplemented_requests;
  for (const char* key : kEnabledSections) {
    ConfigReader r = top.section(key, Strictness::kWarnUnknown);
    if (r.get_bool("enabled", false)) on.push_back(std::string(key) + ".enabled");
  }
  // DeepSpeed no longer reads this legacy MoQ section but for its eigenvalue part (which it
  // asserts off); MoQ is compression_training's weight quantization now.
  if (top.section("quantize_training", Strictness::kWarnUnknown).get_bool("enabled", false)) {
    on.emplace_back("quantize_training.enabled (the legacy MoQ section; MoQ is "
                    "compression_training.weight_quantization with quantize_weight_in_forward "
                    "false, docs/compression.md)");
  }
  read_sparse_attention(top);  // validated whole; the model builds its attention from it
  read_compression_training(top, on);  // validated whole; what this build lacks is refused
  if (top.section("compile", Strictness::kWarnUnknown).get_bool("deepcompile", false)) {
    on.emplace_back("compile.deepcompile");
  }
  read_tensor_parallel_section(top, &on);  // AutoTP is implemented; the section is strict
  read_expert_parallel_section(top, &on);  // AutoEP is implemented (the engine reads it again)
  if (top.get_bool("graph_harvesting", false)) on.emplace_back("graph_harvesting");
  // Keys read elsewhere in DeepSpeed (model setup, inference); type-checked here so that a wrong
  // type is reported rather than carried along.
  top.get_opt_int("vocabulary_size", 1);
  top.get_bool("use_data_before_expert_parallelism", false);
  top.get_bool("disable_allgather", false);
  top.get_opt_int("allgather_size", 1);
  top.section("weight_quantization", Strictness::kWarnUnknown);
}

}  // namespace deepspeed::config_detail

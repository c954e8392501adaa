// Sections of features this build does not implement: read only far enough to know whether they
// ask for the feature, with every key that decides it type-checked, so that check_supported()
// refuses an enabled feature by name and a disabled section passes. Their other keys are kept
// verbatim in DeepSpeedConfig::raw.
#include "config/feature_sections.h"
#include "config/tensor_parallel_section.h"

namespace deepspeed::config_detail {
namespace {

// Sections switched on by "enabled": true (DeepSpeed's default is false for each).
constexpr const char* kEnabledSections[] = {
    "amp", "nebula", "datastates", "eigenvalue", "quantize_training"};

// compression_training's techniques (DeepSpeed's compression/constants.py). Each is on when its
// shared_parameters.enabled is true; layer_reduction has its own "enabled".
constexpr const char* kCompressionTechniques[] = {
    "weight_quantization", "activation_quantization", "sparse_pruning", "row_pruning",
    "head_pruning",        "channel_pruning"};

void parse_compression_training(ConfigReader& top, std::vector<std::string>& on) {
  ConfigReader r = top.section("compression_training", Strictness::kWarnUnknown);
  if (!r.present()) return;
  for (const char* technique : kCompressionTechniques) {
    ConfigReader t = r.section(technique, Strictness::kWarnUnknown);
    ConfigReader shared = t.section("shared_parameters", Strictness::kWarnUnknown);
    if (shared.get_bool("enabled", false)) {
      on.push_back("compression_training." + std::string(technique));
    }
  }
  ConfigReader lr = r.section("layer_reduction", Strictness::kWarnUnknown);
  if (lr.get_bool("enabled", false)) on.emplace_back("compression_training.layer_reduction");
  r.finish();  // a misspelt technique would otherwise be silently off
}

}  // namespace

void parse_unimplemented_sections(ConfigReader& top, DeepSpeedConfig& c) {
  auto& on = c.unimplemented_requests;
  for (const char* key : kEnabledSections) {
    ConfigReader r = top.section(key, Strictness::kWarnUnknown);
    if (r.get_bool("enabled", false)) on.push_back(std::string(key) + ".enabled");
  }
  // Matches DeepSpeed: a sparse_attention section turns sparse attention on.
  if (top.section("sparse_attention", Strictness::kWarnUnknown).present()) {
    on.emplace_back("sparse_attention");
  }
  parse_compression_training(top, on);
  if (top.section("compile", Strictness::kWarnUnknown).get_bool("deepcompile", false)) {
    on.emplace_back("compile.deepcompile");
  }
  read_tensor_parallel_section(top, &on);  // AutoTP is implemented; the section is strict
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

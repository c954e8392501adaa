// The expert_parallel section (DeepSpeed 0.19.8's AutoEP config): its defaults, DeepSpeed's
// errors, each naming the key, what this build lacks refused by name, and the keys that find a
// Hugging Face module's parts warned about.
#include <gtest/gtest.h>

#include "config/expert_parallel_section.h"
#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

DeepSpeedConfig load(const std::string& section) {
  return DeepSpeedConfig::from_string(
      R"({"train_batch_size": 4, "expert_parallel": )" + section + "}", 1);
}

std::string config_error(const std::string& section) {
  try {
    load(section);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no ConfigError";
}

std::string refusal(const std::string& section) {
  try {
    load(section).check_supported();
  } catch (const NotSupportedError& e) {
    return e.what();
  }
  return "no NotSupportedError";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ExpertParallelConfig, ReadsTheSectionWithDeepSpeedsDefaults) {
  auto s = config_detail::expert_parallel_section(load("{}"));
  EXPECT_FALSE(s.enabled);
  s = config_detail::expert_parallel_section(load(
      R"({"enabled": true, "autoep_size": 4, "preset_model": "mixtral", "top_k": 1,
          "score_func": "sigmoid", "route_norm": false, "routed_scaling_factor": 2.5,
          "route_scale": 1.5, "use_grouped_mm": false, "combine_impl": "weighted_sum"})"));
  EXPECT_TRUE(s.enabled);
  EXPECT_EQ(s.autoep_size, 4);
  EXPECT_EQ(s.preset_model.value_or(""), "mixtral");
  EXPECT_EQ(s.top_k.value_or(0), 1);
  EXPECT_EQ(s.score_func, "sigmoid");
  EXPECT_EQ(s.score_apply, "auto");
  EXPECT_EQ(s.route_norm, std::optional<bool>(false));
  EXPECT_DOUBLE_EQ(s.route_scale, 2.5);  // routed_scaling_factor wins, as in DeepSpeed
  s = config_detail::expert_parallel_section(
      load(R"({"enabled": true, "top_k": "auto", "routed_scaling_factor": "auto", "route_norm": null})"));
  EXPECT_FALSE(s.top_k.has_value());
  EXPECT_FALSE(s.route_norm.has_value());
  EXPECT_DOUBLE_EQ(s.route_scale, 1.0);
  EXPECT_NO_THROW(load(R"({"enabled": true, "autoep_size": 2})").check_supported());
  // Off, the rest is not read (DeepSpeed validates it only when enabled).
  EXPECT_NO_THROW(load(R"({"enabled": false, "score_apply": "sideways"})"));
}

TEST(ExpertParallelConfig, DeepSpeedsErrorsNameTheKey) {
  EXPECT_TRUE(has(config_error(R"({"load_balance_coeff": 0.01})"),
                  "expert_parallel.load_balance_coeff is not supported"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "autoep_size": 0})"), "expert_parallel.autoep_size"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "expert_tensor_parallel_size": 2})"),
                  "expert_parallel.expert_tensor_parallel_size is reserved"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "preset_model": "gpt"})"),
                  "available presets: deepseek_v2, deepseek_v3, minimax_m3, mixtral"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "score_apply": "sideways"})"),
                  "expert_parallel.score_apply must be one of auto, pre, post"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "combine_impl": "sum"})"),
                  "expert_parallel.combine_impl must be one of"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "gate_up_impl": "fused", "use_grouped_mm": false})"),
                  "expert_parallel.gate_up_impl"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "row_weighting_impl": "fused"})"),
                  "only runs inside the DeepEP route"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "comm_backend": "deepep"})"),
                  "expert_parallel.comm_max_tokens_per_rank must be a positive integer"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "comm_num_sm": 0})"), "expert_parallel.comm_num_sm"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "num_expert_groups": 2, "num_limited_groups": 3})"),
                  "expert_parallel.num_limited_groups (3) must be <= num_expert_groups (2)"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "expert_activation": "gelu"})"),
                  "expert_parallel.expert_activation must be one of swiglu"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "expert_w1": "mlp.w1"})"),
                  "expert_parallel.expert_w1 must be a direct attribute name"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "moe_layer_pattern": "(("})"),
                  "expert_parallel.moe_layer_pattern is not a valid regular expression"));
  EXPECT_TRUE(has(config_error(R"({"enabled": true, "score_apply": "pre", "combine_impl": "fused_weighted_sum"})"),
                  "requires score_apply \"post\""));
}

TEST(ExpertParallelConfig, RefusesWhatThisBuildLacksByName) {
  EXPECT_TRUE(has(refusal(R"({"enabled": true, "comm_backend": "deepep", "comm_max_tokens_per_rank": 4096})"),
                  "expert_parallel.comm_backend \"deepep\""));
  EXPECT_TRUE(has(refusal(R"({"enabled": true, "expert_activation": "swiglu_oai"})"),
                  "expert_parallel.expert_activation \"swiglu_oai\""));
  EXPECT_TRUE(has(refusal(R"({"enabled": true, "has_shared_experts": true})"),
                  "expert_parallel.has_shared_experts"));
  EXPECT_NO_THROW(load(R"({"enabled": true, "expert_activation": "swiglu"})").check_supported());
  // DeepSeek's group-limited routing is read (and checked per layer by the engine).
  EXPECT_NO_THROW(load(R"({"enabled": true, "num_expert_groups": 4, "num_limited_groups": 2})")
                      .check_supported());
}

TEST(ExpertParallelConfig, WarnsAboutHuggingFaceModuleKeysAndUnknownOnes) {
  const auto c = load(R"({"enabled": true, "router_pattern": "gate", "expert_w3": null, "autoep_sise": 2})");
  auto warned = [&](const std::string& part) {
    for (const auto& w : c.warnings) {
      if (has(w, part)) return true;
    }
    return false;
  };
  EXPECT_TRUE(warned("expert_parallel.router_pattern names a Hugging Face module's part"));
  EXPECT_TRUE(warned("expert_parallel.expert_w3"));
  EXPECT_TRUE(warned("autoep_sise"));
}

}  // namespace
}  // namespace deepspeed

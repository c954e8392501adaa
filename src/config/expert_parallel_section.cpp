// The expert_parallel section (see expert_parallel_section.h).
#include "config/expert_parallel_section.h"

#include <algorithm>
#include <regex>

namespace deepspeed::config_detail {
namespace {

// A string key that takes one of `allowed` ("auto" included where it is one).
std::string read_choice(ConfigReader& r, const std::string& key, const std::string& def,
                        const std::vector<std::string>& allowed) {
  const std::string v = r.take_auto(key) ? "auto" : r.get_string(key, def);
  for (const auto& a : allowed) {
    if (v == a) return v;
  }
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  r.fail(key, "must be one of " + list + ", got \"" + v + "\"");
}

// DeepSpeed's _validate_attr_name: a direct attribute name (non-empty, no dots) when set.
std::optional<std::string> read_attr_name(ConfigReader& r, const std::string& key) {
  const auto v = r.get_opt_string(key);
  if (v && v->empty()) r.fail(key, "must be a non-empty string");
  if (v && v->find('.') != std::string::npos) {
    r.fail(key, "must be a direct attribute name (no dots), got \"" + *v + "\"");
  }
  return v;
}

}  // namespace

const std::vector<std::string>& autoep_preset_names() {
  static const std::vector<std::string> names = {"deepseek_v2", "deepseek_v3", "minimax_m3",
                                                 "mixtral",     "qwen3_5_moe", "qwen3_moe"};
  return names;
}

ExpertParallelSection read_expert_parallel_section(ConfigReader& top,
                                                   std::vector<std::string>* unimplemented) {
  ExpertParallelSection s;
  ConfigReader r = top.section("expert_parallel", Strictness::kWarnUnknown);
  if (!r.present()) return s;
  // Checked whether or not the section is enabled, as DeepSpeed does.
  if (r.get_raw("load_balance_coeff", "null")) {
    r.fail("load_balance_coeff", "is not supported by AutoEP (it would route through "
           "auxiliary-loss-free load balancing); set it to null or omit the key");
  }
  r.get_bool("validate_folding_routing", false);
  r.get_bool("async_split_plan", false);
  s.enabled = r.get_bool("enabled", false);
  if (!s.enabled) {
    r.mark_all_known();
    r.finish();
    return s;
  }
  s.autoep_size = r.get_int("autoep_size", 1, 1);
  if (r.get_int("expert_tensor_parallel_size", 1, 1) != 1) {
    r.fail("expert_tensor_parallel_size", "is reserved for expert-internal tensor parallelism, "
           "which DeepSpeed does not support yet; use 1");
  }
  s.preset_model = r.get_opt_string("preset_model");
  if (s.preset_model) {
    const auto& names = autoep_preset_names();
    if (std::find(names.begin(), names.end(), *s.preset_model) == names.end()) {
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      r.fail("preset_model", "is \"" + *s.preset_model + "\"; available presets: " + list);
    }
  }
  s.moe_layer_pattern = r.get_opt_string("moe_layer_pattern");
  if (s.moe_layer_pattern) {
    try {
      std::regex check(*s.moe_layer_pattern);
    } catch (const std::regex_error& e) {
      r.fail("moe_layer_pattern", "is not a valid regular expression: " + std::string(e.what()));
    }
  }
  // Kernel and layout choices. Each is validated as DeepSpeed does; the CPU/Gloo build has one
  // grouped-experts path and one combine, which every valid choice computes.
  const bool grouped_mm = r.get_bool("use_grouped_mm", true);
  r.get_bool("disable_triton_grouped_mm", false);
  s.score_apply = read_choice(r, "score_apply", "auto", {"auto", "pre", "post"});
  const std::string combine = read_choice(
      r, "combine_impl", "auto", {"auto", "weighted_sum", "fused_weighted_sum", "legacy_bmm"});
  const std::string rows = read_choice(r, "row_weighting_impl", "auto", {"auto", "eager", "fused"});
  const std::string gate_up = read_choice(r, "gate_up_impl", "separate", {"separate", "fused"});
  if (gate_up == "fused" && !grouped_mm) {
    r.fail("gate_up_impl", "\"fused\" runs the gate and up projections as one grouped GEMM, but "
           "use_grouped_mm false selects the sequential expert loop");
  }
  const std::string backend = read_choice(r, "comm_backend", "comm", {"comm", "deepep"});
  if (rows == "fused" && backend != "deepep") {
    r.fail("row_weighting_impl", "\"fused\" only runs inside the DeepEP route; comm_backend is \"" +
           backend + "\"");
  }
  if (rows == "fused" && s.autoep_size == 1) {
    r.fail("row_weighting_impl", "\"fused\" only runs when DeepEP dispatch is active "
           "(autoep_size > 1)");
  }
  r.get_int("comm_num_sm", 12, 1);
  r.get_int("comm_qp_margin", 4, 0);
  const int64_t max_tokens = r.get_int("comm_max_tokens_per_rank", 0, 0);
  if (backend == "deepep") {
    if (max_tokens == 0) {
      r.fail("comm_max_tokens_per_rank", "must be a positive integer when comm_backend is "
             "\"deepep\": the most tokens one rank can route");
    }
    unimplemented->emplace_back("expert_parallel.comm_backend \"deepep\" (DeepEP kernels; "
                                "\"comm\" is the all-to-all this build has)");
  }
  if (combine == "fused_weighted_sum" && s.score_apply == "pre") {
    r.fail("combine_impl", "\"fused_weighted_sum\" requires score_apply \"post\"");
  }
  s.score_func = read_choice(r, "score_func", "auto", {"auto", "softmax", "sigmoid"});
  if (!r.take_auto("top_k")) s.top_k = r.get_opt_int("top_k", 1);
  if (r.has("route_norm") && r.get_raw("route_norm", "true, false or null")) {
    s.route_norm = r.get_bool("route_norm", true);
  }
  s.route_scale = r.get_double("route_scale", 1.0);
  if (!r.take_auto("routed_scaling_factor")) {
    if (r.get_raw("routed_scaling_factor", "a number or \"auto\"")) {
      s.route_scale = r.get_double("routed_scaling_factor", 1.0);  // DeepSpeed: it wins
    }
  }
  s.num_expert_groups = r.get_opt_int("num_expert_groups", 1);
  s.num_limited_groups = r.get_opt_int("num_limited_groups", 1);
  if (s.num_expert_groups && s.num_limited_groups && *s.num_limited_groups > *s.num_expert_groups) {
    r.fail("num_limited_groups", "(" + std::to_string(*s.num_limited_groups) + ") must be <= "
           "num_expert_groups (" + std::to_string(*s.num_expert_groups) + ")");
  }
  const auto activation = r.get_opt_string("expert_activation");
  if (activation && *activation != "swiglu") {
    const std::vector<std::string> known = {"geglu_tanh", "swiglu_clamped", "swiglu_oai"};
    if (std::find(known.begin(), known.end(), *activation) == known.end()) {
      r.fail("expert_activation", "must be one of swiglu, geglu_tanh, swiglu_clamped, "
             "swiglu_oai, got \"" + *activation + "\"");
    }
    unimplemented->emplace_back("expert_parallel.expert_activation \"" + *activation +
                                "\" (TokenChoiceMoE's experts are SwiGLU)");
  }
  // Where DeepSpeed finds a Hugging Face block's router and experts. A C++ model's blocks are
  // TokenChoiceMoE layers, found by type, whose parts have fixed names: these are checked as
  // DeepSpeed checks them and otherwise do nothing, which the warning says.
  for (const char* key : {"router_pattern", "expert_pattern", "expert_w1", "expert_w2",
                          "num_experts_attr", "top_k_attr", "shared_experts_pattern",
                          "shared_experts_gate_pattern"}) {
    if (read_attr_name(r, key)) {
      r.warn(key, "names a Hugging Face module's part; a C++ model's MoE blocks are "
             "TokenChoiceMoE layers with fixed names, so it is not used");
    }
  }
  if (r.has("expert_w3")) {
    if (r.get_raw("expert_w3", "a string or null")) read_attr_name(r, "expert_w3");
    r.warn("expert_w3", "names a Hugging Face module's part; it is not used here");
  }
  if (r.get_raw("has_shared_experts", "true, false or null") &&
      r.get_bool("has_shared_experts", false)) {
    unimplemented->emplace_back("expert_parallel.has_shared_experts (a C++ model adds its shared "
                                "expert beside its TokenChoiceMoE block, outside AutoEP)");
  }
  r.finish();
  return s;
}

ExpertParallelSection expert_parallel_section(const DeepSpeedConfig& c) {
  std::vector<std::string> warnings, unimplemented;
  ConfigReader top(&c.raw, "", c.source, Strictness::kWarnUnknown, &warnings);
  return read_expert_parallel_section(top, &unimplemented);
}

}  // namespace deepspeed::config_detail

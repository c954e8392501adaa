// See auto_ep_setup.h.
#include "runtime/auto_ep_setup.h"

#include <regex>

#include "config/expert_parallel_section.h"
#include "deepspeed/auto_ep.h"
#include "runtime/zero/stage3_init.h"
#include "runtime/zero/stage3_param.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// A model built under zero::Init has its experts partitioned over the data-parallel group:
// they are gathered whole first, so that AutoEP keeps this rank's slice of the whole weights
// (which the ZeRO-3 engine then partitions over the expert-data-parallel group).
void make_whole(const at::Tensor& weight, const comm::Group& dp_group, const std::string& layer) {
  auto pre = take_pre_partitioned(weight);
  if (!pre) return;
  DS_CHECK(pre->world == dp_group.size(), NotSupportedError, "expert_parallel (AutoEP): layer '",
           layer, "''s experts were partitioned by zero::Init over ", pre->world, " ranks, not "
           "over the data-parallel group of ", dp_group.size());
  at::Tensor gathered = at::empty({pre->shard.numel() * pre->world}, pre->shard.options());
  all_gather_shards(gathered, pre->shard, /*async=*/false, ShardGroup(dp_group));
  storage_as_flat(weight, weight.numel()).copy_(gathered.narrow(0, 0, weight.numel()));
}

// DeepSpeed's group-limited routing keys, checked per layer as its validate_autoep_post_detection
// does; DeepSeek-V2's preset scores a group by its best expert, the others by their two best.
void configure_group_routing(const config_detail::ExpertParallelSection& s,
                             const std::string& name, const std::string& source,
                             moe::TokenChoiceOptions* o) {
  if (!s.num_expert_groups && !s.num_limited_groups) return;
  DS_CHECK(s.num_expert_groups, ConfigError, source, ": expert_parallel.num_limited_groups "
           "requires num_expert_groups to be set in layer '", name, "'");
  const int64_t groups = *s.num_expert_groups, e = o->num_experts;
  DS_CHECK(e % groups == 0, ConfigError, source, ": expert_parallel.num_expert_groups (", groups,
           ") must divide num_experts (", e, ") in layer '", name, "'");
  DS_CHECK(s.num_limited_groups, ConfigError, source, ": expert_parallel.num_limited_groups must "
           "be set when num_expert_groups is set in layer '", name, "'");
  o->num_expert_groups = groups;
  o->num_limited_groups = *s.num_limited_groups;
  if (s.preset_model == std::optional<std::string>("deepseek_v2")) o->group_score_func = "max";
  const int64_t per_group = e / groups, candidates = o->num_limited_groups * per_group;
  DS_CHECK(o->group_score_func != "top2_sum" || per_group >= 2, ConfigError, source,
           ": expert_parallel.num_expert_groups (", groups, ") leaves ", per_group,
           " expert per group in layer '", name, "'; scoring a group by its two best experts "
           "needs at least 2");
  DS_CHECK(o->top_k <= candidates, ConfigError, source, ": top_k (", o->top_k, ") exceeds the ",
           candidates, " experts of expert_parallel.num_limited_groups (",
           o->num_limited_groups, ") groups in layer '", name, "'");
}

}  // namespace

void configure_auto_ep(torch::nn::Module& module, const DeepSpeedConfig& config,
                       const comm::Group& dp_group, bool model_parallel) {
  const auto s = config_detail::expert_parallel_section(config);
  if (!s.enabled) return;
  std::vector<std::pair<std::string, std::shared_ptr<moe::TokenChoiceMoEImpl>>> layers;
  for (auto& item : moe::token_choice_layers(module)) {
    if (s.moe_layer_pattern && !std::regex_match(item.first, std::regex(*s.moe_layer_pattern))) {
      continue;
    }
    layers.push_back(std::move(item));
  }
  DS_CHECK(!layers.empty(), ConfigError, config.source, ": expert_parallel.enabled is true but "
           "the model has no TokenChoiceMoE layer",
           s.moe_layer_pattern ? " whose name matches moe_layer_pattern \"" +
                                     *s.moe_layer_pattern + "\""
                               : std::string());
  DS_CHECK(!model_parallel, NotSupportedError, config.source, ": expert_parallel (AutoEP) with "
           "tensor or pipeline parallelism is not supported yet");
  const int64_t ep = s.autoep_size;
  DS_CHECK(dp_group.size() % ep == 0, ConfigError, config.source, ": expert_parallel.autoep_size (",
           ep, ") must divide the data-parallel size (", dp_group.size(), ")");
  for (auto& [name, layer] : layers) {
    const int64_t e = layer->num_experts();
    DS_CHECK(ep <= e, ConfigError, config.source, ": expert_parallel.autoep_size=", ep,
             " exceeds num_experts=", e, " in layer '", name, "'; each rank must own at least "
             "one expert");
    DS_CHECK(e % ep == 0, ConfigError, config.source, ": num_experts=", e, " in layer '", name,
             "' is not divisible by expert_parallel.autoep_size=", ep);
    auto& o = layer->mutable_options();
    if (s.top_k) {
      DS_CHECK(*s.top_k <= e, ConfigError, config.source, ": expert_parallel.top_k=", *s.top_k,
               " exceeds num_experts=", e, " in layer '", name, "'");
      o.top_k = *s.top_k;
    }
    if (s.score_func != "auto") o.score_func = s.score_func;
    if (s.score_apply != "auto") o.score_apply = s.score_apply;
    if (s.route_norm) o.route_norm = *s.route_norm;
    if (s.route_scale != 1.0) o.route_scale = s.route_scale;
    configure_group_routing(s, name, config.source, &o);
  }
  const bool data_before_expert =
      config.raw.is_object() && config.raw.value("use_data_before_expert_parallelism", false);
  const moe::ExpertGroups& groups =
      moe::create_expert_and_data_parallel(ep, data_before_expert, &dp_group);
  torch::NoGradGuard no_grad;
  for (auto& [name, layer] : layers) {
    for (const auto& w : layer->expert_parameters()) make_whole(w, dp_group, name);
  }
  for (auto& [name, layer] : layers) {
    // Each rank keeps a slice of the whole weights: they must be the same everywhere first.
    if (dp_group.size() > 1) {
      for (const auto& w : layer->expert_parameters()) {
        at::Tensor t = w.detach();
        comm::broadcast(t, dp_group.global_rank(0), false, dp_group);
      }
    }
    layer->shard_experts(&groups);
  }
}

}  // namespace deepspeed::runtime

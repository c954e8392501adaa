// The `data_efficiency` section. Its data_routing.random_ltd part is read in full when enabled
// (DeepSpeed indexes every key then, so a missing one is reported here by name rather than at the
// first forward); data_sampling in data_sampling_section.cpp.
#include "config/feature_sections.h"

#include <algorithm>

namespace deepspeed::config_detail {
namespace {

void require(ConfigReader& r, const char* key) {
  if (!r.has(key)) r.fail(key, "is required when random_ltd is enabled");
}

void parse_schedule(ConfigReader& ltd, RandomLtdConfig& cfg) {
  require(ltd, "random_ltd_schedule");
  ConfigReader s = ltd.section("random_ltd_schedule", Strictness::kWarnUnknown);
  for (const char* key : {"min_value", "max_value", "schedule_type", "schedule_config"}) {
    if (!s.has(key)) s.fail(key, "is required when random_ltd is enabled");
  }
  cfg.min_value = s.get_int("min_value", 0, 1);
  cfg.max_value = s.get_int("max_value", 0, 1);
  if (cfg.max_value < cfg.min_value) {
    s.fail("max_value", "is " + std::to_string(cfg.max_value) + ", below min_value " +
                            std::to_string(cfg.min_value));
  }
  cfg.schedule_type = s.get_string("schedule_type", "");
  if (cfg.schedule_type != "fixed_linear") {
    // DeepSpeed raises "Unsupported random LTD schedule type" at the first forward.
    s.fail("schedule_type", "is \"" + cfg.schedule_type + "\"; expected \"fixed_linear\"");
  }
  ConfigReader sc = s.section("schedule_config", Strictness::kWarnUnknown);
  for (const char* key : {"require_steps", "seq_per_step"}) {
    if (!sc.has(key)) sc.fail(key, "is required when random_ltd is enabled");
  }
  cfg.require_steps = sc.get_int("require_steps", 1, 1);
  cfg.seq_per_step = sc.get_int("seq_per_step", 1, 1);
  sc.finish();
  s.finish();
}

void parse_random_ltd(ConfigReader& routing, DeepSpeedConfig& c) {
  ConfigReader ltd = routing.section("random_ltd", Strictness::kWarnUnknown);
  RandomLtdConfig& cfg = c.data_efficiency.random_ltd;
  cfg.enabled = ltd.get_bool("enabled", false);
  if (!cfg.enabled) {
    // Matches DeepSpeed: a disabled random_ltd's other keys are never read.
    ltd.mark_all_known();
    ltd.finish();
    return;
  }
  for (const char* key : {"total_layer_num", "random_ltd_layer_num", "random_ltd_layer_id",
                          "model_mask_name", "model_type", "hidden_state_order"}) {
    require(ltd, key);
  }
  cfg.total_layer_num = ltd.get_int("total_layer_num", 0, 1);
  cfg.random_ltd_layer_num = ltd.get_int("random_ltd_layer_num", 0, 0);
  cfg.random_ltd_layer_id = ltd.get_int_list("random_ltd_layer_id", 0);
  std::sort(cfg.random_ltd_layer_id.begin(), cfg.random_ltd_layer_id.end());  // as DeepSpeed
  const auto& ids = cfg.random_ltd_layer_id;
  if (std::adjacent_find(ids.begin(), ids.end()) != ids.end()) {
    ltd.fail("random_ltd_layer_id", "names a layer twice");
  }
  if (!ids.empty() && ids.back() >= cfg.total_layer_num) {
    ltd.fail("random_ltd_layer_id", "names layer " + std::to_string(ids.back()) +
                                        "; total_layer_num is " +
                                        std::to_string(cfg.total_layer_num));
  }
  if (cfg.random_ltd_layer_num != static_cast<int64_t>(ids.size())) {
    // DeepSpeed's ValueError, raised when it counts the wrapped layers.
    ltd.fail("random_ltd_layer_num", "is " + std::to_string(cfg.random_ltd_layer_num) +
                                         "; it must equal the length of random_ltd_layer_id (" +
                                         std::to_string(ids.size()) + ")");
  }
  if (ltd.get_raw("model_mask_name", "a string or null") != nullptr) {  // null: no mask
    cfg.model_mask_name = ltd.get_string("model_mask_name", "");
  }
  cfg.model_type = ltd.get_string("model_type", "");
  if (cfg.model_type != "decoder" && cfg.model_type != "encoder") {
    ltd.fail("model_type", "is \"" + cfg.model_type + "\"; expected \"decoder\" or \"encoder\"");
  }
  cfg.hidden_state_order = ltd.get_string("hidden_state_order", "");
  if (cfg.hidden_state_order != "batch_seq_dim" && cfg.hidden_state_order != "seq_batch_dim") {
    ltd.fail("hidden_state_order", "is \"" + cfg.hidden_state_order +
                                       "\"; expected \"batch_seq_dim\" or \"seq_batch_dim\"");
  }
  parse_schedule(ltd, cfg);
  ConfigReader lr = ltd.section("layer_token_lr_schedule", Strictness::kWarnUnknown);
  if (lr.get_bool("enabled", false)) {
    // DeepSpeed raises NotImplementedError for it too.
    c.unimplemented_requests.emplace_back(
        "data_efficiency.data_routing.random_ltd.layer_token_lr_schedule.enabled");
  }
  lr.mark_all_known();
  lr.finish();
  // Keys DeepSpeed's engine fills in itself (from the batch sizes); a user's value is replaced.
  ltd.mark_known("global_batch_size");
  ltd.mark_known("micro_batch_size");
  ltd.finish();
}

}  // namespace

void parse_data_efficiency(ConfigReader& top, DeepSpeedConfig& c) {
  ConfigReader de = top.section("data_efficiency", Strictness::kWarnUnknown);
  DataEfficiencyConfig& d = c.data_efficiency;
  d.enabled = de.get_bool("enabled", false);
  d.seed = de.get_int("seed", 1234);
  read_data_sampling(de, d.seed, c.warnings);
  ConfigReader routing = de.section("data_routing", Strictness::kWarnUnknown);
  d.data_routing_enabled = routing.get_bool("enabled", false);
  parse_random_ltd(routing, c);
  routing.finish();
  de.finish();
  if (d.random_ltd.enabled && !(d.enabled && d.data_routing_enabled)) {
    const std::string off =
        d.enabled ? "data_efficiency.data_routing.enabled" : "data_efficiency.enabled";
    c.warnings.push_back("data_efficiency.data_routing.random_ltd.enabled is true while " + off +
                         " is false: random-LTD is on, as in DeepSpeed, which reads "
                         "random_ltd.enabled alone");
  }
}

void resolve_data_efficiency(const DeepSpeedConfig& c, json& j) {
  const DataEfficiencyConfig& d = c.data_efficiency;
  const RandomLtdConfig& r = d.random_ltd;
  json ltd = {{"enabled", r.enabled}};
  if (r.enabled) {
    ltd.update({{"total_layer_num", r.total_layer_num},
                {"random_ltd_layer_num", r.random_ltd_layer_num},
                {"random_ltd_layer_id", r.random_ltd_layer_id},
                {"model_mask_name", r.model_mask_name ? json(*r.model_mask_name) : json()},
                {"model_type", r.model_type},
                {"hidden_state_order", r.hidden_state_order},
                {"random_ltd_schedule",
                 {{"min_value", r.min_value},
                  {"max_value", r.max_value},
                  {"schedule_type", r.schedule_type},
                  {"schedule_config",
                   {{"require_steps", r.require_steps}, {"seq_per_step", r.seq_per_step}}}}}});
  }
  const data_sampling::DataSamplingConfig ds = data_sampling::data_sampling_config(c);
  json curriculum = {{"enabled", ds.curriculum_enabled}};
  if (ds.curriculum_enabled) {
    json metrics = json::object();
    for (const auto& m : ds.metrics) {
      metrics[m.name] = {{"difficulty_type", m.difficulty_type},
                         {"clustering_type", m.clustering_type},
                         {"min_difficulty", m.schedule.min_difficulty},
                         {"max_difficulty", m.schedule.max_difficulty},
                         {"schedule_type", m.schedule.schedule_type}};
    }
    curriculum.update({{"data_cluster_path", ds.data_cluster_path},
                       {"curriculum_metrics", metrics}});
  }
  const data_sampling::DynamicBatchingConfig db = data_sampling::dynamic_batching_config(c);
  json dynamic = {{"enabled", db.enabled}};
  if (db.enabled) {
    dynamic.update({{"metrics_path", db.metrics_path},
                    {"lr_scaling_method", db.lr_scaling_method},
                    {"min_batch_size", db.min_batch_size},
                    {"max_batch_size", db.max_batch_size ? json(*db.max_batch_size) : json()},
                    {"sequence_picking_order", db.sequence_picking_order},
                    {"max_tokens", db.max_tokens},
                    {"verbose", db.verbose}});
  }
  j["data_efficiency"] = {{"enabled", d.enabled},
                          {"seed", d.seed},
                          {"data_sampling", {{"enabled", ds.enabled},
                                             {"num_epochs", ds.num_epochs},
                                             {"curriculum_learning", curriculum},
                                             {"dynamic_batching", dynamic}}},
                          {"data_routing", {{"enabled", d.data_routing_enabled},
                                            {"random_ltd", ltd}}}};
}

}  // namespace deepspeed::config_detail

// The `autotuning` section: DeepSpeed's keys and defaults (autotuning/constants.py), typed and
// checked in one place for the engine and for the launcher's tuner. DeepSpeed's legacy dict
// reader ignores unknown keys here; a misspelt key would silently change nothing, so this one
// refuses it with a close match.
#include <algorithm>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/autotuning_config.h"

namespace deepspeed {
namespace {

using config_detail::ConfigReader;
using config_detail::Strictness;

void check_one_of(ConfigReader& r, const std::string& key, const std::string& value,
                  const std::vector<std::string>& allowed) {
  if (std::find(allowed.begin(), allowed.end(), value) != allowed.end()) return;
  std::string list;
  for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
  r.fail(key, "is \"" + value + "\"; expected one of " + list);
}

// Unknown keys are errors (see the file comment), phrased without claiming DeepSpeed does so.
void finish_strictly(ConfigReader& r, std::vector<std::string>& unknown) {
  r.finish();
  if (!unknown.empty()) {
    throw ConfigError(unknown.front().substr(0, unknown.front().rfind("; it is ignored")) +
                      " (see docs/autotuning.md for the autotuning keys)");
  }
}

AutotuningModelInfoConfig parse_model_info(ConfigReader& top, std::vector<std::string>& unknown) {
  ConfigReader r = top.section("model_info", Strictness::kWarnUnknown);
  AutotuningModelInfoConfig m;
  m.profile = r.get_bool("profile", false);
  m.num_params = r.get_opt_int("num_params", 1);
  m.hidden_size = r.get_opt_int("hidden_size", 1);
  m.num_layers = r.get_opt_int("num_layers", 1);
  finish_strictly(r, unknown);
  return m;
}

}  // namespace

AutotuningConfig AutotuningConfig::from_json(const json* section, const std::string& source) {
  if (section != nullptr && !section->is_null() && !section->is_object()) {
    throw ConfigError(source + ": autotuning is " + config_detail::show(*section) + "; expected an object");
  }
  std::vector<std::string> unknown;
  ConfigReader r(section != nullptr && section->is_null() ? nullptr : section, "autotuning", source,
                 Strictness::kWarnUnknown, &unknown);
  AutotuningConfig c;
  c.enabled = r.get_bool("enabled", false);
  c.fast = r.get_bool("fast", true);
  c.results_dir = r.get_string("results_dir", c.results_dir);
  if (c.results_dir.empty()) r.fail("results_dir", "is empty; give a folder for the results");
  c.exps_dir = r.get_string("exps_dir", c.exps_dir);
  if (c.exps_dir.empty()) r.fail("exps_dir", "is empty; give a folder for the experiments");
  c.overwrite = r.get_bool("overwrite", true);
  c.start_profile_step = r.get_int("start_profile_step", 3, 1);
  c.end_profile_step = r.get_int("end_profile_step", 5, 1);
  if (c.end_profile_step < c.start_profile_step) {
    r.fail("end_profile_step", "is " + std::to_string(c.end_profile_step) +
                                   "; expected at least start_profile_step (" +
                                   std::to_string(c.start_profile_step) + ")");
  }
  c.metric_path = r.get_opt_string("metric_path").value_or("");
  c.metric = r.get_string("metric", c.metric);
  check_one_of(r, "metric", c.metric, {"throughput", "latency", "flops"});
  c.tuner_type = r.get_string("tuner_type", c.tuner_type);
  check_one_of(r, "tuner_type", c.tuner_type, {"gridsearch", "random", "model_based"});
  c.tuner_early_stopping = r.get_int("tuner_early_stopping", 5, 1);
  c.tuner_num_trials = r.get_int("tuner_num_trials", 50, 1);
  if (const json* m = r.get_raw("arg_mappings", "an object of ds_config key -> program flag")) {
    if (!m->is_object()) r.fail("arg_mappings", "is " + config_detail::show(*m) + "; expected an object");
    for (auto it = m->begin(); it != m->end(); ++it) {
      if (!it.value().is_string()) {
        r.fail("arg_mappings", "entry '" + it.key() + "' is " + config_detail::show(it.value()) +
                                   "; expected the program's flag as a string, e.g. \"--micro_batch\"");
      }
      c.arg_mappings[it.key()] = it.value().get<std::string>();
    }
  }
  c.max_train_batch_size = r.get_opt_int("max_train_batch_size", 1);
  c.min_train_batch_size = r.get_int("min_train_batch_size", 1, 1);
  c.max_train_micro_batch_size_per_gpu = r.get_int("max_train_micro_batch_size_per_gpu", 1024, 1);
  c.min_train_micro_batch_size_per_gpu = r.get_int("min_train_micro_batch_size_per_gpu", 1, 1);
  if (c.max_train_micro_batch_size_per_gpu < c.min_train_micro_batch_size_per_gpu) {
    r.fail("max_train_micro_batch_size_per_gpu",
           "is " + std::to_string(c.max_train_micro_batch_size_per_gpu) +
               "; expected at least min_train_micro_batch_size_per_gpu (" +
               std::to_string(c.min_train_micro_batch_size_per_gpu) + ")");
  }
  if (c.max_train_batch_size && *c.max_train_batch_size < c.min_train_batch_size) {
    r.fail("max_train_batch_size", "is " + std::to_string(*c.max_train_batch_size) +
                                       "; expected at least min_train_batch_size (" +
                                       std::to_string(c.min_train_batch_size) + ")");
  }
  c.num_tuning_micro_batch_sizes = r.get_int("num_tuning_micro_batch_sizes", 3, 1);
  c.mp_size = r.get_int("mp_size", 1, 1);
  // "model_info": null (DeepSpeed's default) means no model info.
  if (r.section("model_info", Strictness::kWarnUnknown).present()) c.model_info = parse_model_info(r, unknown);
  c.model_info_path = r.get_opt_string("model_info_path").value_or("");
  finish_strictly(r, unknown);
  return c;
}

json AutotuningConfig::to_json() const {
  json j = {{"enabled", enabled},
            {"fast", fast},
            {"results_dir", results_dir},
            {"exps_dir", exps_dir},
            {"overwrite", overwrite},
            {"start_profile_step", start_profile_step},
            {"end_profile_step", end_profile_step},
            {"metric_path", metric_path.empty() ? json() : json(metric_path)},
            {"metric", metric},
            {"tuner_type", tuner_type},
            {"tuner_early_stopping", tuner_early_stopping},
            {"tuner_num_trials", tuner_num_trials},
            {"arg_mappings", arg_mappings.empty() ? json() : json(arg_mappings)},
            {"max_train_batch_size", max_train_batch_size ? json(*max_train_batch_size) : json()},
            {"min_train_batch_size", min_train_batch_size},
            {"max_train_micro_batch_size_per_gpu", max_train_micro_batch_size_per_gpu},
            {"min_train_micro_batch_size_per_gpu", min_train_micro_batch_size_per_gpu},
            {"num_tuning_micro_batch_sizes", num_tuning_micro_batch_sizes},
            {"mp_size", mp_size},
            {"model_info_path", model_info_path.empty() ? json() : json(model_info_path)}};
  if (model_info) {
    auto opt = [](const std::optional<int64_t>& v) { return v ? json(*v) : json(); };
    j["model_info"] = {{"profile", model_info->profile},
                       {"num_params", opt(model_info->num_params)},
                       {"hidden_size", opt(model_info->hidden_size)},
                       {"num_layers", opt(model_info->num_layers)}};
  } else {
    j["model_info"] = nullptr;
  }
  return j;
}

}  // namespace deepspeed

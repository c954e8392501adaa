// data_efficiency.data_sampling. DeepSpeed reads curriculum_learning's keys when the sampler is
// built and its CurriculumScheduler asserts each metric's schedule; this build checks them all at
// config load, each error naming its key. The DataSampler reads the section again from the raw
// JSON (data_sampling_config), so that the engine's config struct need not carry it.
#include "config/feature_sections.h"
#include "deepspeed/data_sampling_config.h"

namespace deepspeed::config_detail {
namespace {

void require(ConfigReader& r, const char* key, const std::string& why) {
  if (!r.has(key)) r.fail(key, "is required " + why);
}

data_sampling::CurriculumMetricConfig parse_metric(ConfigReader& m, const std::string& name,
                                                   std::vector<std::string>& warnings) {
  data_sampling::CurriculumMetricConfig out;
  out.name = name;
  const std::string why = "for every curriculum metric";
  require(m, "difficulty_type", why);
  require(m, "clustering_type", why);
  out.difficulty_type = m.get_string("difficulty_type", "");
  if (out.difficulty_type != "value" && out.difficulty_type != "percentile") {
    m.fail("difficulty_type", "is \"" + out.difficulty_type +
                                  "\"; expected \"value\" or \"percentile\"");
  }
  out.clustering_type = m.get_string("clustering_type", "");
  if (out.clustering_type != "schedule_based" && out.clustering_type != "single_cluster") {
    m.fail("clustering_type", "is \"" + out.clustering_type +
                                  "\"; expected \"schedule_based\" or \"single_cluster\"");
  }
  if (out.clustering_type != "single_cluster") {
    const std::string needs = "with clustering_type \"schedule_based\"";
    require(m, "index_to_sample_path", needs);
    out.index_to_sample_path = m.get_string("index_to_sample_path", "");
    if (out.difficulty_type == "value") {
      require(m, "index_to_metric_path", needs + " and difficulty_type \"value\"");
      out.index_to_metric_path = m.get_string("index_to_metric_path", "");
    } else {
      m.mark_known("index_to_metric_path");  // DeepSpeed reads it for value-based ones only
    }
  } else {
    m.mark_known("index_to_sample_path");
    m.mark_known("index_to_metric_path");
  }
  out.schedule.enabled = true;
  parse_curriculum_schedule(m, out.schedule, warnings, why);
  if (out.difficulty_type == "percentile") {
    // The sampler admits max_difficulty-ths of the epoch per percentile step.
    if (out.schedule.max_difficulty <= 0) {
      m.fail("max_difficulty", "is " + std::to_string(out.schedule.max_difficulty) +
                                   "; a percentile difficulty needs a positive maximum");
    }
    if (out.schedule.min_difficulty < 0) {
      m.fail("min_difficulty", "is " + std::to_string(out.schedule.min_difficulty) +
                                   "; a percentile is at least 0");
    }
  }
  m.finish();
  return out;
}

void parse_curriculum(ConfigReader& s, data_sampling::DataSamplingConfig& out,
                      std::vector<std::string>& warnings) {
  ConfigReader cl = s.section("curriculum_learning", Strictness::kWarnUnknown);
  out.curriculum_enabled = cl.get_bool("enabled", false);
  if (!out.curriculum_enabled) {
    cl.mark_all_known();  // DeepSpeed reads nothing else of a disabled curriculum
    cl.finish();
    return;
  }
  const std::string why = "when data_sampling.curriculum_learning is enabled";
  require(cl, "data_cluster_path", why);
  require(cl, "curriculum_metrics", why);
  out.data_cluster_path = cl.get_string("data_cluster_path", "");
  if (out.data_cluster_path.empty()) cl.fail("data_cluster_path", "is empty");
  const json* raw = cl.get_raw("curriculum_metrics", "an object of metrics");
  ConfigReader metrics = cl.section("curriculum_metrics", Strictness::kWarnUnknown);
  if (raw == nullptr || raw->empty()) {
    cl.fail("curriculum_metrics", "names no metric; curriculum learning needs at least one");
  }
  for (const auto& item : raw->items()) {
    ConfigReader m = metrics.section(item.key(), Strictness::kWarnUnknown);
    out.metrics.push_back(parse_metric(m, item.key(), warnings));
  }
  metrics.finish();
  cl.finish();
}

}  // namespace

data_sampling::DataSamplingConfig read_data_sampling(ConfigReader& de, int64_t seed,
                                                     std::vector<std::string>& warnings) {
  data_sampling::DataSamplingConfig out;
  out.seed = seed;
  ConfigReader s = de.section("data_sampling", Strictness::kWarnUnknown);
  const std::string path = "data_efficiency.data_sampling";
  out.enabled = s.get_bool("enabled", false);
  out.num_epochs = s.get_int("num_epochs", 1000, 1);
  // DataLoader knobs: the sampler here yields indices and the caller loads them.
  if (s.get_int("num_workers", 0, 0) != 0) {
    warnings.push_back(s.where("num_workers") + " has no effect: deepspeed-cpp's DataSampler "
                       "yields sample indices, which your own code loads");
  }
  if (s.get_bool("pin_memory", false)) {
    warnings.push_back(s.where("pin_memory") + " has no effect: deepspeed-cpp's DataSampler "
                       "yields sample indices, which your own code loads");
  }
  parse_curriculum(s, out, warnings);
  (void)read_dynamic_batching(s, seed);  // checked here; variable_batch.h reads it again
  s.finish();
  if (out.curriculum_enabled && !out.enabled) {
    warnings.push_back(path + ".curriculum_learning.enabled is true while " + path +
                       ".enabled is false: the curriculum is on, as in DeepSpeed, whose engine "
                       "reads curriculum_learning.enabled alone");
  }
  return out;
}

}  // namespace deepspeed::config_detail

namespace deepspeed::data_sampling {

DataSamplingConfig data_sampling_config(const DeepSpeedConfig& config) {
  using config_detail::ConfigReader;
  using config_detail::Strictness;
  const json* de = nullptr;
  if (config.raw.is_object() && config.raw.contains("data_efficiency")) {
    de = &config.raw.at("data_efficiency");
  }
  std::vector<std::string> warnings;  // reported once, when the config was loaded
  ConfigReader top(de, "data_efficiency", config.source, Strictness::kWarnUnknown, &warnings);
  top.mark_all_known();
  return config_detail::read_data_sampling(top, config.data_efficiency.seed, warnings);
}

}  // namespace deepspeed::data_sampling

// The `elasticity` section and the batch it sets (DeepSpeed's runtime/config.py and
// elasticity/config.py).
#include "config/elasticity_section.h"

#include <cstdlib>
#include <iterator>

#include "config/batch_config.h"
#include "deepspeed/elasticity.h"

namespace deepspeed::config_detail {
namespace {

constexpr const char* kBatchKeys[] = {"train_batch_size", "train_micro_batch_size_per_gpu",
                                      "gradient_accumulation_steps"};

}  // namespace

ElasticityConfig parse_elasticity(ConfigReader& r) {
  ElasticityConfig e;
  e.enabled = r.get_bool("enabled", false);
  if (e.enabled) {
    for (const char* key : {"max_train_batch_size", "micro_batch_sizes"}) {
      if (!r.has(key)) r.fail(key, "is missing; an enabled elasticity section needs it");
    }
  }
  e.max_train_batch_size = r.get_int("max_train_batch_size", e.max_train_batch_size, 1);
  if (r.has("micro_batch_sizes")) {
    e.micro_batch_sizes = r.get_int_list("micro_batch_sizes", 1);
    if (e.micro_batch_sizes.empty()) {
      r.fail("micro_batch_sizes", "is empty; expected a list of positive integers");
    }
  }
  e.min_gpus = r.get_int("min_gpus", e.min_gpus, 1);
  e.max_gpus = r.get_int("max_gpus", e.max_gpus, 1);
  if (e.min_gpus > e.max_gpus) r.fail("min_gpus", "is greater than max_gpus");
  e.min_time = r.get_double("min_time", 0);
  if (e.min_time < 0) r.fail("min_time", "is negative; expected >= 0");
  e.prefer_larger_batch = r.get_bool("prefer_larger_batch", true);
  e.num_gpus_per_node = r.get_int("num_gpus_per_node", 1, 1);
  e.model_parallel_size = r.get_int("model_parallel_size", 1, 1);
  e.ignore_non_elastic_batch_info = r.get_bool("ignore_non_elastic_batch_info", false);
  e.version = r.get_double("version", elasticity::kLatestVersion);
  r.finish();
  return e;
}

BatchConfig elastic_batch_triad(ConfigReader& top, DeepSpeedConfig& c, int64_t dp_world_size) {
  const ElasticityConfig& e = c.elasticity;
  const elasticity::ElasticBatch batch =
      elasticity::compute_elastic_config(e, dp_world_size, c.source);
  elasticity::ensure_immutable_elastic_config(e, c.source, &c.warnings);
  const int64_t micro = *batch.micro_batch_size;
  const int64_t accumulation = batch.final_batch_size / (micro * dp_world_size);
  const int64_t values[] = {batch.final_batch_size, micro, accumulation};
  for (size_t i = 0; i < std::size(kBatchKeys); ++i) {
    const char* key = kBatchKeys[i];
    if (!top.has(key)) continue;
    if (!e.ignore_non_elastic_batch_info) {
      top.fail(key, "is set, and so is elasticity.enabled: elasticity computes the batch (here " +
                        std::to_string(values[i]) +
                        ") and would not use it; remove the batch keys, or set "
                        "elasticity.ignore_non_elastic_batch_info to have them overridden");
    }
    const std::string given = top.take_auto(key) ? "\"auto\"" : top.get_raw(key)->dump();
    c.warnings.push_back(c.source + ": [Elasticity] overriding " + key + ": " + given + " -> " +
                         std::to_string(values[i]));
  }
  c.notes.push_back(c.source + ": elasticity: train_batch_size " +
                    std::to_string(batch.final_batch_size) + " = micro " +
                    std::to_string(micro) + " x accum " + std::to_string(accumulation) +
                    " x data-parallel size " + std::to_string(dp_world_size) +
                    "; valid data-parallel sizes " + elasticity::python_list(batch.valid_gpus));
  return resolve_batch_triad(batch.final_batch_size, micro, accumulation, dp_world_size,
                             c.source);
}

}  // namespace deepspeed::config_detail

namespace deepspeed::elasticity {

ElasticityConfig read_elasticity_config(const json& section, const std::string& source) {
  if (!section.is_object()) {
    throw ElasticityError(source + ": elasticity is " + section.dump() + "; expected an object");
  }
  json doc = {{"elasticity", section}};
  std::vector<std::string> warnings;
  config_detail::ConfigReader top(&doc, "", source, config_detail::Strictness::kWarnUnknown,
                                  &warnings);
  config_detail::ConfigReader r =
      top.section("elasticity", config_detail::Strictness::kWarnUnknown);
  try {
    return config_detail::parse_elasticity(r);
  } catch (const ConfigError& error) {
    throw ElasticityError(error.what());
  }
}

void ensure_immutable_elastic_config(const ElasticityConfig& runtime, const std::string& source,
                                     std::vector<std::string>* warnings) {
  const char* env = std::getenv(kSchedulerConfigEnv);
  if (env == nullptr) {
    warnings->push_back(source + ": " + kSchedulerConfigEnv +
                        " is not set, so nothing guarantees that the resource scheduler scales "
                        "this job to one of its valid GPU counts");
    return;
  }
  const json section = json::parse(env, nullptr, /*allow_exceptions=*/false);
  if (section.is_discarded()) {
    throw ElasticityError(source + ": " + kSchedulerConfigEnv +
                          " is not JSON (the elasticity section the scheduler planned with)");
  }
  const ElasticityConfig scheduler = read_elasticity_config(section, kSchedulerConfigEnv);
  auto mismatch = [&](const std::string& key, const std::string& theirs,
                      const std::string& ours) {
    throw ElasticityError(source + ": elasticity." + key + " is " + ours + ", but the resource " +
                          "scheduler planned with " + theirs + " (" + kSchedulerConfigEnv + ")");
  };
  if (runtime.max_train_batch_size != scheduler.max_train_batch_size) {
    mismatch("max_train_batch_size", std::to_string(scheduler.max_train_batch_size),
             std::to_string(runtime.max_train_batch_size));
  }
  if (runtime.micro_batch_sizes != scheduler.micro_batch_sizes) {
    mismatch("micro_batch_sizes", python_list(scheduler.micro_batch_sizes),
             python_list(runtime.micro_batch_sizes));
  }
  if (runtime.version != scheduler.version) {
    mismatch("version", json(scheduler.version).dump(), json(runtime.version).dump());
  }
}

}  // namespace deepspeed::elasticity

// data_efficiency.data_sampling.dynamic_batching. DeepSpeed's config reader (data_pipeline/
// config.py) fills the defaults and asserts max_tokens when enabled; its other values are
// checked only where they are used. Here every key is checked at config load, each error
// naming its key. Users of the section read it again from the raw JSON.
#include <cctype>

#include "config/feature_sections.h"
#include "deepspeed/dynamic_batching_config.h"

namespace deepspeed::config_detail {

data_sampling::DynamicBatchingConfig read_dynamic_batching(ConfigReader& s, int64_t seed) {
  data_sampling::DynamicBatchingConfig out;
  out.seed = seed;
  ConfigReader d = s.section("dynamic_batching", Strictness::kWarnUnknown);
  out.enabled = d.get_bool("enabled", false);
  out.metrics_path = d.get_string("metrics_path", "");
  out.lr_scaling_method = d.get_string("lr_scaling_method", "linear");
  std::string method = out.lr_scaling_method;
  for (auto& ch : method) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  if (method == "NONE") out.lr_scaling_method = "none";  // DeepSpeed compares it uppercased
  if (out.lr_scaling_method != "linear" && out.lr_scaling_method != "sqrt" &&
      out.lr_scaling_method != "none") {
    d.fail("lr_scaling_method", "is \"" + out.lr_scaling_method +
                                    "\"; expected \"linear\", \"sqrt\" or \"none\"");
  }
  out.min_batch_size = d.get_int("min_batch_size", 1, 0);
  out.max_batch_size = d.get_opt_int("max_batch_size", 1);
  if (out.max_batch_size && *out.max_batch_size < out.min_batch_size) {
    d.fail("max_batch_size", "is " + std::to_string(*out.max_batch_size) +
                                 ", below min_batch_size " + std::to_string(out.min_batch_size));
  }
  out.sequence_picking_order = d.get_string("sequence_picking_order", "dataloader");
  if (out.sequence_picking_order != "dataloader" && out.sequence_picking_order != "random" &&
      out.sequence_picking_order != "seqlen") {
    d.fail("sequence_picking_order", "is \"" + out.sequence_picking_order +
                                         "\"; expected \"dataloader\", \"random\" or \"seqlen\"");
  }
  if (out.enabled && !d.has("max_tokens")) {
    d.fail("max_tokens", "is required when dynamic batching is enabled");
  }
  out.max_tokens = d.get_int("max_tokens", 0, 1);
  out.verbose = d.get_bool("verbose", false);
  d.finish();
  return out;
}

}  // namespace deepspeed::config_detail

namespace deepspeed::data_sampling {

DynamicBatchingConfig dynamic_batching_config(const DeepSpeedConfig& config) {
  using config_detail::ConfigReader;
  using config_detail::Strictness;
  const json* de = nullptr;
  if (config.raw.is_object() && config.raw.contains("data_efficiency")) {
    de = &config.raw.at("data_efficiency");
  }
  std::vector<std::string> warnings;  // reported once, when the config was loaded
  ConfigReader top(de, "data_efficiency", config.source, Strictness::kWarnUnknown, &warnings);
  top.mark_all_known();
  ConfigReader sampling = top.section("data_sampling", Strictness::kWarnUnknown);
  sampling.mark_all_known();
  return config_detail::read_dynamic_batching(sampling, config.data_efficiency.seed);
}

}  // namespace deepspeed::data_sampling

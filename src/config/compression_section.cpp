// compression_training (DeepSpeed's compression/config.py): every key DeepSpeed reads, with its
// defaults, and its assertions as errors naming the key. DeepSpeed reads only the keys it knows
// and checks some only when a layer is built; here all are checked at config load. What this
// build lacks is refused by name (c.unimplemented_requests): snip_momentum pruning (Intel
// Neural Compressor's pruners) and the CUDA quantizer kernel.
#include "config/feature_sections.h"
#include "deepspeed/compression_config.h"

namespace deepspeed::config_detail {
namespace {

using compression::CompressionConfig;
using compression::GroupConfig;
using compression::TechniqueConfig;

enum class Kind { kWeight, kActivation, kSparse, kRow, kHead, kChannel };

void require_one_of(ConfigReader& r, const std::string& key, const std::string& value,
                    std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (value == a) return;
    list += std::string(list.empty() ? "" : ", ") + "\"" + a + "\"";
  }
  r.fail(key, "is \"" + value + "\"; expected one of " + list);
}

// "modules" is a list of patterns; DeepSpeed's default is the string "*".
std::vector<std::string> read_modules(ConfigReader& g) {
  if (!g.has("modules")) return {"*"};
  const json* v = g.get_raw("modules", "a list of module name patterns");
  if (v != nullptr && v->is_string()) return {v->get<std::string>()};
  return g.get_string_list("modules");
}

std::vector<std::vector<std::string>> read_related(ConfigReader& g, size_t n_modules) {
  std::vector<std::vector<std::string>> out;
  const json* v = g.get_raw("related_modules", "a list of lists of module name patterns");
  if (v == nullptr) return out;
  const std::string expected = "expected one list of module name patterns per entry of modules";
  if (!v->is_array()) g.fail("related_modules", "is " + show(*v) + "; " + expected);
  for (const auto& entry : *v) {
    if (!entry.is_array()) g.fail("related_modules", "contains " + show(entry) + "; " + expected);
    std::vector<std::string> patterns;
    for (const auto& p : entry) {
      if (!p.is_string()) g.fail("related_modules", "contains " + show(p) + "; " + expected);
      patterns.push_back(p.get<std::string>());
    }
    out.push_back(std::move(patterns));
  }
  if (out.size() != n_modules) {
    g.fail("related_modules", "has " + std::to_string(out.size()) + " entries for " +
                                  std::to_string(n_modules) + " modules; " + expected);
  }
  return out;
}

GroupConfig read_group(ConfigReader& groups, const std::string& name, Kind kind,
                       const TechniqueConfig& t) {
  ConfigReader g = groups.section(name, Strictness::kWarnUnknown);
  GroupConfig out;
  out.name = name;
  out.modules = read_modules(g);
  out.related_modules = read_related(g, out.modules.size());
  ConfigReader p = g.section("params", Strictness::kWarnUnknown);
  auto required = [&](const char* key) {
    if (!p.has(key)) {
      p.fail(key, std::string("is required for each group (") + name + " has none)");
    }
  };
  switch (kind) {
    case Kind::kWeight:
      required("start_bits");
      required("target_bits");
      out.start_bits = p.get_int("start_bits", 0, 1);
      out.target_bits = p.get_int("target_bits", 0, 1);
      out.quantization_period = p.get_int("quantization_period", 1, 1);
      // Matches DeepSpeed's Quantizer assertion, here before training instead of at a step.
      if (out.start_bits < out.target_bits) {
        p.fail("start_bits", "is " + std::to_string(out.start_bits) + ", below target_bits " +
                                 std::to_string(out.target_bits));
      }
      // DeepSpeed's ternary and binary quantizers are symmetric only.
      if (t.enabled && out.target_bits <= 2 && t.quantization_type != "symmetric") {
        p.fail("target_bits", "is " + std::to_string(out.target_bits) +
                                  ": ternary and binary weight quantization are symmetric only");
      }
      break;
    case Kind::kActivation:
      required("bits");
      out.bits = p.get_int("bits", 0);
      if (out.bits != 4 && out.bits != 8) {
        p.fail("bits", "is " + std::to_string(out.bits) +
                           "; only 4 and 8 bit activation quantization are supported");
      }
      break;
    default:
      required("dense_ratio");
      out.dense_ratio = p.get_double("dense_ratio", 0.0);
      if (!(out.dense_ratio > 0.0 && out.dense_ratio <= 1.0)) {
        p.fail("dense_ratio", "is " + std::to_string(out.dense_ratio) +
                                  "; expected the share of weights kept, in (0, 1]");
      }
      break;
  }
  p.finish();
  g.finish();
  return out;
}

TechniqueConfig read_technique(ConfigReader& ct, const char* name, Kind kind,
                               std::vector<std::string>& unimplemented) {
  ConfigReader sec = ct.section(name, Strictness::kWarnUnknown);
  ConfigReader s = sec.section("shared_parameters", Strictness::kWarnUnknown);
  TechniqueConfig t;
  t.enabled = s.get_bool("enabled", false);
  const std::string path = std::string("compression_training.") + name;
  switch (kind) {
    case Kind::kWeight:
      t.quantizer_kernel = s.get_bool("quantizer_kernel", false);
      t.schedule_offset = s.get_int("schedule_offset", 0, 0);
      t.quantize_groups = s.get_int("quantize_groups", 1, 1);
      t.quantize_verbose = s.get_bool("quantize_verbose", false);
      t.quantization_type = s.get_string("quantization_type", "symmetric");
      require_one_of(s, "quantization_type", t.quantization_type, {"symmetric", "asymmetric"});
      t.quantize_weight_in_forward = s.get_bool("quantize_weight_in_forward", false);
      t.rounding = s.get_string("rounding", "nearest");
      require_one_of(s, "rounding", t.rounding, {"nearest", "stochastic"});
      {
        ConfigReader mixed = s.section("fp16_mixed_quantize", Strictness::kWarnUnknown);
        t.fp16_mixed_quantize = mixed.get_bool("enabled", false);
        t.quantize_change_ratio = mixed.get_double("quantize_change_ratio", 0.001);
        mixed.finish();
      }
      if (t.enabled && t.quantizer_kernel) {
        unimplemented.push_back(path + ".shared_parameters.quantizer_kernel (DeepSpeed's CUDA "
                                "quantizer kernel; false quantizes with the same formula)");
      }
      break;
    case Kind::kActivation:
      t.quantization_type = s.get_string("quantization_type", "symmetric");
      require_one_of(s, "quantization_type", t.quantization_type, {"symmetric", "asymmetric"});
      t.range_calibration = s.get_string("range_calibration", "dynamic");
      require_one_of(s, "range_calibration", t.range_calibration, {"dynamic", "static"});
      t.schedule_offset = s.get_int("schedule_offset", 1000, 0);
      break;
    case Kind::kSparse:
      t.method = s.get_string("method", "l1");
      require_one_of(s, "method", t.method, {"l1", "topk", "snip_momentum"});
      t.schedule_offset = s.get_int("schedule_offset", 1000, 0);
      t.schedule_offset_end = t.schedule_offset;
      if (t.method == "snip_momentum") {
        t.block_pattern = s.get_string("block_pattern", "4x1");
        t.dense_ratio = s.get_double("dense_ratio", 0.1);
        if (!(t.dense_ratio > 0.0 && t.dense_ratio < 1.0)) {
          s.fail("dense_ratio", "is " + std::to_string(t.dense_ratio) + "; expected (0, 1)");
        }
        t.schedule_offset_stride = s.get_int("schedule_offset_stride", 1, 1);
        t.excluded_modules = s.get_string_list("excluded_modules");
        t.schedule_offset_end = s.get_int("schedule_offset_end", t.schedule_offset, 0);
        if (t.schedule_offset_end < t.schedule_offset) {
          s.fail("schedule_offset_end", "is " + std::to_string(t.schedule_offset_end) +
                                            ", before schedule_offset " +
                                            std::to_string(t.schedule_offset));
        }
        if (t.enabled) {
          unimplemented.push_back(path + ".shared_parameters.method \"snip_momentum\" (Intel "
                                  "Neural Compressor's pruners)");
        }
      } else {
        // DeepSpeed reads it for snip_momentum only; its scheduler then looks it up for every
        // method (a KeyError without it), so a value given here is honoured.
        t.schedule_offset_end = s.get_int("schedule_offset_end", t.schedule_offset, 0);
      }
      break;
    case Kind::kRow:
    case Kind::kChannel:
      t.method = s.get_string("method", "l1");
      require_one_of(s, "method", t.method, {"l1", "topk"});
      t.schedule_offset = s.get_int("schedule_offset", 1000, 0);
      break;
    case Kind::kHead:
      t.method = s.get_string("method", "topk");
      require_one_of(s, "method", t.method, {"l1", "topk"});
      t.schedule_offset = s.get_int("schedule_offset", 1000, 0);
      if (t.enabled) {
        if (!s.has("num_heads")) s.fail("num_heads", "is required when head pruning is enabled");
        t.num_heads = s.get_int("num_heads", 0, 1);
        // DeepSpeed's layer raises NotImplementedError for any other method.
        if (t.method != "topk") {
          s.fail("method", "is \"" + t.method + "\"; head pruning supports \"topk\" only");
        }
      }
      break;
  }
  s.finish();
  ConfigReader groups = sec.section("different_groups", Strictness::kWarnUnknown);
  const bool needs_groups = !(kind == Kind::kSparse && t.method == "snip_momentum");
  if (t.enabled && needs_groups && !groups.present()) {
    sec.fail("different_groups", "must be given when the technique is enabled");
  }
  if (groups.present()) {
    const json* all = sec.get_raw("different_groups");
    for (auto it = all->begin(); it != all->end(); ++it) {
      t.groups.push_back(read_group(groups, it.key(), kind, t));
    }
  }
  groups.finish();
  sec.finish();
  return t;
}

compression::LayerReductionConfig read_layer_reduction(ConfigReader& ct) {
  ConfigReader r = ct.section("layer_reduction", Strictness::kWarnUnknown);
  compression::LayerReductionConfig out;
  out.enabled = r.get_bool("enabled", false);
  if (!out.enabled) {
    r.mark_all_known();  // DeepSpeed reads nothing else of a disabled section
    return out;
  }
  for (const char* key : {"keep_number_layer", "module_name_prefix", "teacher_layer"}) {
    if (!r.has(key)) r.fail(key, "is required when layer reduction is enabled");
  }
  out.keep_number_layer = r.get_int("keep_number_layer", 0, 1);
  out.module_name_prefix = r.get_string("module_name_prefix", "");
  out.teacher_layer = r.get_int_list("teacher_layer", 0);
  out.other_module_name = r.get_string_list("other_module_name");
  if (static_cast<int64_t>(out.teacher_layer.size()) != out.keep_number_layer) {
    r.fail("teacher_layer", "names " + std::to_string(out.teacher_layer.size()) +
                                " layers; keep_number_layer is " +
                                std::to_string(out.keep_number_layer));
  }
  r.finish();
  return out;
}

}  // namespace

CompressionConfig read_compression_training(ConfigReader& top,
                                            std::vector<std::string>& unimplemented) {
  ConfigReader ct = top.section("compression_training", Strictness::kWarnUnknown);
  CompressionConfig c;
  c.weight_quantization = read_technique(ct, "weight_quantization", Kind::kWeight, unimplemented);
  c.activation_quantization =
      read_technique(ct, "activation_quantization", Kind::kActivation, unimplemented);
  c.sparse_pruning = read_technique(ct, "sparse_pruning", Kind::kSparse, unimplemented);
  c.row_pruning = read_technique(ct, "row_pruning", Kind::kRow, unimplemented);
  c.head_pruning = read_technique(ct, "head_pruning", Kind::kHead, unimplemented);
  c.channel_pruning = read_technique(ct, "channel_pruning", Kind::kChannel, unimplemented);
  c.layer_reduction = read_layer_reduction(ct);
  ct.finish();  // a misspelt technique would otherwise be silently off
  return c;
}

}  // namespace deepspeed::config_detail

namespace deepspeed::compression {

bool CompressionConfig::any_enabled() const {
  for (const auto& [name, t] : techniques()) {
    if (t->enabled) return true;
  }
  return layer_reduction.enabled;
}

std::vector<std::pair<const char*, const TechniqueConfig*>> CompressionConfig::techniques()
    const {
  return {{"weight_quantization", &weight_quantization},
          {"activation_quantization", &activation_quantization},
          {"sparse_pruning", &sparse_pruning},
          {"row_pruning", &row_pruning},
          {"head_pruning", &head_pruning},
          {"channel_pruning", &channel_pruning}};
}

CompressionConfig read_compression_config(const json& ds_config, const std::string& source) {
  using config_detail::ConfigReader;
  using config_detail::Strictness;
  if (!ds_config.is_object()) {
    throw ConfigError(source + ": expected a JSON object (a DeepSpeed config)");
  }
  std::vector<std::string> warnings, unimplemented;
  ConfigReader top(&ds_config, "", source, Strictness::kWarnUnknown, &warnings);
  top.mark_all_known();
  CompressionConfig c = config_detail::read_compression_training(top, unimplemented);
  if (!unimplemented.empty()) {
    throw NotSupportedError(source + ": " + unimplemented.front() + " is not supported yet");
  }
  return c;
}

CompressionConfig compression_config(const DeepSpeedConfig& config) {
  return read_compression_config(config.raw.is_object() ? config.raw : json::object(),
                                 config.source);
}

}  // namespace deepspeed::compression

// ds_config.json -> DeepSpeedConfig: every section DeepSpeed documents, with its defaults.
// Strict sections (DeepSpeed's pydantic models) reject unknown keys; legacy dict sections and
// the top level warn about them by name. Feature support is decided in supported_features.cpp.
#include <algorithm>
#include <cctype>
#include <utility>

#include "config/batch_config.h"
#include "config/config_source.h"
#include "config/elasticity_section.h"
#include "config/feature_sections.h"
#include "config/json_reader.h"
#include "config/low_precision_masters.h"
#include "deepspeed/autotuning_config.h"
#include "util/check.h"

namespace deepspeed {
namespace {

using config_detail::ConfigReader;
using config_detail::Strictness;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

std::string upper(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  return s;
}

void check_one_of(ConfigReader& r, const std::string& key, const std::string& value,
                  std::initializer_list<const char*> allowed) {
  for (const char* a : allowed) {
    if (value == a) return;
  }
  std::string list;
  for (const char* a : allowed) list += (list.empty() ? "" : ", ") + std::string(a);
  r.fail(key, "is \"" + value + "\"; expected one of " + list);
}

Fp16Config parse_fp16(ConfigReader r) {
  Fp16Config c;
  c.enabled = r.get_bool("enabled", c.enabled);
  c.auto_cast = r.get_bool("auto_cast", c.auto_cast);
  c.loss_scale = r.get_double("loss_scale", c.loss_scale);
  if (c.loss_scale < 0) r.fail("loss_scale", "is negative; use 0 for dynamic scaling");
  c.initial_scale_power = r.get_int("initial_scale_power", c.initial_scale_power, 0);
  c.loss_scale_window = r.get_int("loss_scale_window", c.loss_scale_window, 1);
  c.hysteresis = r.get_int("hysteresis", c.hysteresis, 1);
  c.consecutive_hysteresis = r.get_bool("consecutive_hysteresis", c.consecutive_hysteresis);
  c.min_loss_scale = r.get_double("min_loss_scale", c.min_loss_scale);
  if (c.min_loss_scale <= 0) r.fail("min_loss_scale", "must be > 0");
  c.fp16_master_weights_and_grads =
      r.get_bool("fp16_master_weights_and_grads", c.fp16_master_weights_and_grads);
  r.finish();
  return c;
}

Bf16Config parse_bf16(ConfigReader r) {
  Bf16Config c;
  c.enabled = r.get_bool("enabled", c.enabled);
  c.immediate_grad_update = r.get_bool("immediate_grad_update", c.immediate_grad_update);
  c.check_grad_overflow = r.get_bool("check_grad_overflow", c.check_grad_overflow);
  c.bf16_master_weights_and_grads =
      r.get_bool("bf16_master_weights_and_grads", c.bf16_master_weights_and_grads);
  c.bf16_optimizer_states = r.get_bool("bf16_optimizer_states", c.bf16_optimizer_states);
  if (c.bf16_optimizer_states && !c.bf16_master_weights_and_grads) {
    r.fail("bf16_optimizer_states", "requires bf16_master_weights_and_grads: true");
  }
  r.finish();
  return c;
}

OffloadDevice parse_device(ConfigReader& r) {
  const std::string d = lower(r.get_string("device", "none"));
  check_one_of(r, "device", d, {"none", "cpu", "nvme"});
  if (d == "cpu") return OffloadDevice::kCpu;
  if (d == "nvme") return OffloadDevice::kNvme;
  return OffloadDevice::kNone;
}

OffloadOptimizerConfig parse_offload_optimizer(ConfigReader r) {
  OffloadOptimizerConfig c;
  c.device = parse_device(r);
  c.nvme_path = r.get_string("nvme_path", c.nvme_path);
  c.buffer_count = r.get_int("buffer_count", c.buffer_count, 0);
  c.pin_memory = r.get_bool("pin_memory", c.pin_memory);
  c.pipeline_read = r.get_bool("pipeline_read", c.pipeline_read);
  c.pipeline_write = r.get_bool("pipeline_write", c.pipeline_write);
  c.fast_init = r.get_bool("fast_init", c.fast_init);
  c.ratio = r.get_double("ratio", c.ratio);
  if (c.ratio < 0 || c.ratio > 1) r.fail("ratio", "must be within [0, 1]");
  c.super_offload = r.get_bool("super_offload", c.super_offload);
  c.cpuadam_cores_perc = r.get_double("cpuadam_cores_perc", c.cpuadam_cores_perc);
  r.mark_known("pipeline");  // legacy: pipeline_read || pipeline_write
  r.finish();
  if (c.device == OffloadDevice::kNvme && c.nvme_path.empty()) {
    r.fail("nvme_path", "must be set when device is \"nvme\"");
  }
  return c;
}

OffloadParamConfig parse_offload_param(ConfigReader r) {
  OffloadParamConfig c;
  c.device = parse_device(r);
  c.nvme_path = r.get_string("nvme_path", c.nvme_path);
  c.buffer_count = r.get_int("buffer_count", c.buffer_count, 0);
  c.buffer_size = r.get_int("buffer_size", c.buffer_size, 0);
  c.max_in_cpu = r.get_int("max_in_cpu", c.max_in_cpu, 0);
  c.pin_memory = r.get_bool("pin_memory", c.pin_memory);
  r.finish();
  if (c.device == OffloadDevice::kNvme && c.nvme_path.empty()) {
    r.fail("nvme_path", "must be set when device is \"nvme\"");
  }
  return c;
}

// DeepSpeed reads both keys unchecked (a missing one is a KeyError in its first reduction); both
// are required here, and a weight outside [0, 1] would let the carried error grow unbounded.
LocoConfig parse_loco(ConfigReader r) {
  LocoConfig c;
  for (const char* key : {"err_beta", "reset_T"}) {
    if (!r.has(key)) r.fail(key, "is missing (LoCo needs both err_beta and reset_T)");
  }
  c.err_beta = r.get_double("err_beta", c.err_beta);
  if (!(c.err_beta >= 0.0 && c.err_beta <= 1.0)) {
    r.fail("err_beta",
           "is " + config_detail::show(json(c.err_beta)) + "; expected a value in [0, 1]");
  }
  c.reset_T = r.get_int("reset_T", c.reset_T, 0);
  r.finish();
  return c;
}

ZeroConfig parse_zero(ConfigReader& top, std::vector<std::string>* warnings) {
  ZeroConfig c;
  const json* z = top.get_raw("zero_optimization", "an object");
  if (z == nullptr) return c;
  if (z->is_boolean()) {
    // Legacy form: true/false means stage 1/0, bucket size from top-level allgather_size.
    c.stage = z->get<bool>() ? 1 : 0;
    c.allgather_bucket_size = top.get_int("allgather_size", c.allgather_bucket_size, 1);
    warnings->push_back(top.where("zero_optimization") +
                        ": the boolean form is deprecated; use {\"stage\": " +
                        std::to_string(c.stage) + "}");
    return c;
  }
  if (!z->is_object()) {
    top.fail("zero_optimization", "is " + config_detail::show(*z) + "; expected an object");
  }
  ConfigReader rr = top.section("zero_optimization", Strictness::kStrict);
  c.stage = rr.get_int("stage", c.stage, 0);
  if (c.stage > 3) {
    rr.fail("stage", "is " + std::to_string(c.stage) + "; expected 0, 1, 2 or 3");
  }
  c.contiguous_gradients = rr.get_bool("contiguous_gradients", c.contiguous_gradients);
  c.reduce_scatter = rr.get_bool("reduce_scatter", c.reduce_scatter);
  // "auto" sizes are filled from the model at initialize (config/auto_sizes.h), as Hugging
  // Face's integration fills them from the model's hidden size.
  auto auto_size = [&](const char* key, const char* alias) {
    const bool a = rr.take_auto(key);
    const bool b = alias != nullptr && rr.take_auto(alias);
    if (!a && !b) return false;
    if (alias != nullptr && rr.has(key) && rr.has(alias)) {
      rr.fail(key, std::string("and its alias '") + alias + "' are both set; keep one");
    }
    c.auto_sizes.emplace_back(key);
    return true;
  };
  // Matches DeepSpeed: 0 is accepted and reduces every gradient on its own.
  if (!auto_size("reduce_bucket_size", nullptr)) {
    c.reduce_bucket_size = rr.get_int("reduce_bucket_size", c.reduce_bucket_size, 0);
  }
  c.use_multi_rank_bucket_allreduce =
      rr.get_bool("use_multi_rank_bucket_allreduce", c.use_multi_rank_bucket_allreduce);
  c.allgather_partitions = rr.get_bool("allgather_partitions", c.allgather_partitions);
  c.allgather_bucket_size = rr.get_int("allgather_bucket_size", c.allgather_bucket_size, 1);
  if (c.allgather_bucket_size % 2 != 0) {
    rr.fail("allgather_bucket_size", "is " + std::to_string(c.allgather_bucket_size) +
                                         "; it must be a multiple of 2 (the start alignment "
                                         "factor of partitions)");
  }
  if (rr.get_raw("overlap_comm", "true or false") != nullptr) {
    c.overlap_comm = rr.get_bool("overlap_comm", false);
  }
  c.load_from_fp32_weights = rr.get_bool("load_from_fp32_weights", c.load_from_fp32_weights);
  c.elastic_checkpoint = rr.get_bool("elastic_checkpoint", c.elastic_checkpoint);
  // DeepSpeed passes it to its ZeRO-1/2 optimizer only (stage 3 is refused by name).
  if (c.elastic_checkpoint && c.stage == 0) {
    warnings->push_back(rr.where("elastic_checkpoint") + " has no effect with ZeRO stage 0 (it "
                        "lays out the optimizer-states files of ZeRO stages 1 and 2)");
  }
  ConfigReader op = rr.section("offload_param", Strictness::kStrict);
  if (op.present()) c.offload_param = parse_offload_param(op);
  ConfigReader oo = rr.section("offload_optimizer", Strictness::kStrict);
  if (oo.present()) c.offload_optimizer = parse_offload_optimizer(oo);
  if (c.param_offload() != OffloadDevice::kNone && c.stage != 3) {
    warnings->push_back(op.where("device") + " \"" + offload_device_name(c.param_offload()) +
                        "\" is ignored with ZeRO stage " + std::to_string(c.stage) +
                        " (parameters are offloaded with stage 3 only, as in DeepSpeed)");
  }
  if (c.optimizer_offload() == OffloadDevice::kNvme && (c.stage == 1 || c.stage == 2)) {
    warnings->push_back(oo.where("device") + " \"nvme\" with ZeRO stage " +
                        std::to_string(c.stage) +
                        ": the optimizer state stays in host memory, as with \"cpu\" (DeepSpeed "
                        "swaps optimizer state to NVMe with stage 3 only)");
  }
  // Deprecated booleans mapped to their replacements, as DeepSpeed does.
  if (rr.get_bool("cpu_offload", false)) {
    if (c.offload_optimizer) rr.fail("cpu_offload", "and offload_optimizer are both set; keep offload_optimizer");
    c.offload_optimizer = OffloadOptimizerConfig{};
    c.offload_optimizer->device = OffloadDevice::kCpu;
    warnings->push_back(rr.where("cpu_offload") + " is deprecated; use offload_optimizer: {\"device\": \"cpu\"}");
  }
  if (rr.get_bool("cpu_offload_param", false)) {
    if (c.offload_param) rr.fail("cpu_offload_param", "and offload_param are both set; keep offload_param");
    c.offload_param = OffloadParamConfig{};
    c.offload_param->device = OffloadDevice::kCpu;
    warnings->push_back(rr.where("cpu_offload_param") + " is deprecated; use offload_param: {\"device\": \"cpu\"}");
  }
  if (rr.has("cpu_offload_use_pin_memory")) {
    rr.get_bool("cpu_offload_use_pin_memory", true);
    warnings->push_back(rr.where("cpu_offload_use_pin_memory") + " is deprecated and ignored");
  }
  c.sub_group_size = rr.get_int("sub_group_size", c.sub_group_size, 1);
  if (!auto_size("stage3_prefetch_bucket_size", "prefetch_bucket_size")) {
    c.stage3_prefetch_bucket_size = rr.get_int_alias(
        "stage3_prefetch_bucket_size", "prefetch_bucket_size", c.stage3_prefetch_bucket_size);
  }
  if (!auto_size("stage3_param_persistence_threshold", "param_persistence_threshold")) {
    c.stage3_param_persistence_threshold =
        rr.get_int_alias("stage3_param_persistence_threshold", "param_persistence_threshold",
                         c.stage3_param_persistence_threshold);
  }
  c.stage3_model_persistence_threshold =
      rr.get_int_alias("stage3_model_persistence_threshold", "model_persistence_threshold",
                    c.stage3_model_persistence_threshold);
  c.stage3_max_live_parameters = rr.get_int_alias("stage3_max_live_parameters",
                                               "max_live_parameters", c.stage3_max_live_parameters);
  c.stage3_max_reuse_distance = rr.get_int_alias("stage3_max_reuse_distance",
                                              "max_reuse_distance", c.stage3_max_reuse_distance);
  if (rr.has("stage3_gather_fp16_weights_on_model_save")) {
    if (rr.has("stage3_gather_16bit_weights_on_model_save") ||
        rr.has("gather_16bit_weights_on_model_save")) {
      rr.fail("stage3_gather_fp16_weights_on_model_save",
              "and its replacement stage3_gather_16bit_weights_on_model_save are both set");
    }
    c.stage3_gather_16bit_weights_on_model_save =
        rr.get_bool("stage3_gather_fp16_weights_on_model_save", false);
    rr.mark_known("stage3_gather_16bit_weights_on_model_save");
    rr.mark_known("gather_16bit_weights_on_model_save");
    warnings->push_back(rr.where("stage3_gather_fp16_weights_on_model_save") +
                        " is deprecated; use stage3_gather_16bit_weights_on_model_save");
  } else {
    c.stage3_gather_16bit_weights_on_model_save =
        rr.get_bool_alias("stage3_gather_16bit_weights_on_model_save",
                       "gather_16bit_weights_on_model_save", false);
  }
  c.stage3_module_granularity_threshold =
      rr.get_int_alias("stage3_module_granularity_threshold", "module_granularity_threshold",
                    c.stage3_module_granularity_threshold);
  c.stage3_use_all_reduce_for_fetch_params =
      rr.get_bool_alias("stage3_use_all_reduce_for_fetch_params",
                     "use_all_reduce_for_fetch_params", false);
  c.stage3_allgather_sequential = rr.get_bool("stage3_allgather_sequential", false);
  c.ignore_unused_parameters = rr.get_bool("ignore_unused_parameters", c.ignore_unused_parameters);
  if (rr.get_bool("legacy_stage1", false)) {
    rr.fail("legacy_stage1", "is true; the legacy stage 1 implementation was removed (DeepSpeed 0.5.9)");
  }
  c.round_robin_gradients = rr.get_bool("round_robin_gradients", c.round_robin_gradients);
  c.zero_hpz_partition_size = rr.get_int("zero_hpz_partition_size", c.zero_hpz_partition_size, 1);
  c.zero_quantized_weights = rr.get_bool("zero_quantized_weights", false);
  c.zero_quantized_nontrainable_weights = rr.get_bool("zero_quantized_nontrainable_weights", false);
  c.zero_quantized_gradients = rr.get_bool("zero_quantized_gradients", false);
  ConfigReader loco = rr.section("zeropp_loco_param", Strictness::kWarnUnknown);
  c.mics_shard_size = rr.get_int("mics_shard_size", c.mics_shard_size);
  c.mics_hierarchical_params_gather = rr.get_bool("mics_hierarchical_params_gather", false);
  // Matches DeepSpeed, which reads MiCS' keys only for stage 3; said rather than ignored.
  if (c.mics_shard_size > 0 && c.stage < 3) {
    warnings->push_back(rr.where("mics_shard_size") + " has no effect with ZeRO stage " +
                        std::to_string(c.stage) + " (MiCS shards stage 3's parameters)");
  }
  if (c.zero_hpz_partition_size > 1 && c.stage < 3) {
    warnings->push_back(rr.where("zero_hpz_partition_size") + " has no effect with ZeRO stage " +
                        std::to_string(c.stage) + " (hpZ partitions stage 3's parameters)");
  }
  // LoCo: qgZ's error feedback (DeepSpeed's all_to_all_loco_quant_reduce), read with qgZ only.
  if (loco.present()) {
    c.zeropp_loco_param = parse_loco(loco);
    if (c.stage != 3 || !c.zero_quantized_gradients) {
      warnings->push_back(rr.where("zeropp_loco_param") + " has no effect without "
                          "zero_quantized_gradients at ZeRO stage 3");
    }
  }
  // DeepSpeed reads ZeRO++'s quantization keys in stage 3's code only.
  for (auto [key, on] : {std::pair<const char*, bool>{"zero_quantized_weights",
                                                      c.zero_quantized_weights},
                         {"zero_quantized_nontrainable_weights",
                          c.zero_quantized_nontrainable_weights},
                         {"zero_quantized_gradients", c.zero_quantized_gradients}}) {
    if (on && c.stage < 3) {
      warnings->push_back(rr.where(key) + " has no effect with ZeRO stage " +
                          std::to_string(c.stage) + " (ZeRO++ quantizes stage 3's collectives)");
    }
  }
  if (c.mics_hierarchical_params_gather && c.mics_shard_size <= 0) {
    warnings->push_back(rr.where("mics_hierarchical_params_gather") +
                        " has no effect without mics_shard_size > 0");
  }
  c.memory_efficient_linear = rr.get_bool("memory_efficient_linear", true);
  c.override_module_apply = rr.get_bool("override_module_apply", true);
  c.pipeline_loading_checkpoint = rr.get_bool("pipeline_loading_checkpoint", false);
  c.log_trace_cache_warnings = rr.get_bool("log_trace_cache_warnings", false);
  c.enable_sanity_checks = rr.get_bool("enable_sanity_checks", false);
  rr.get_bool("save_muon_momentum_buffer_in_memory", false);
  rr.get_raw("leaf_module");
  if (ConfigReader zf = rr.section("zenflow", Strictness::kWarnUnknown); zf.present()) {
    c.zenflow = true;  // refused by check_supported(); its keys are not read
  }
  rr.finish();
  return c;
}

MonitorConfig parse_monitor(ConfigReader r) {
  MonitorConfig c;
  c.enabled = r.get_bool("enabled", c.enabled);
  c.output_path = r.get_string("output_path", c.output_path);
  c.job_name = r.get_string("job_name", c.job_name);
  r.finish();
  return c;
}

WandbConfig parse_wandb(ConfigReader r) {
  WandbConfig c;
  c.enabled = r.get_bool("enabled", c.enabled);
  c.group = r.get_string("group", "");
  c.team = r.get_string("team", "");
  c.project = r.get_string("project", c.project);
  r.finish();
  return c;
}

bool parse_comet(ConfigReader r) {
  const bool enabled = r.get_bool("enabled", false);
  r.get_int("samples_log_interval", 100, 1);
  for (const char* k : {"project", "workspace", "api_key", "experiment_name", "experiment_key",
                        "mode"}) {
    r.get_opt_string(k);
  }
  if (const json* online = r.get_raw("online", "true or false");
      online != nullptr && !online->is_boolean()) {
    r.fail("online", "is " + config_detail::show(*online) + "; expected true or false");
  }
  r.finish();
  return enabled;
}

CommsLoggerConfig parse_comms_logger(ConfigReader r) {
  CommsLoggerConfig c;
  c.enabled = r.get_bool("enabled", c.enabled);
  c.verbose = r.get_bool("verbose", c.verbose);
  c.prof_all = r.get_bool("prof_all", c.prof_all);
  c.prof_ops = r.get_string_list("prof_ops");
  c.debug = r.get_bool("debug", c.debug);
  r.finish();
  return c;
}

// DeepSpeed's checkpoint.writer (deepspeed/runtime/model_checkpointing): the same keys, defaults
// and value checks. What the FAST writer needs of io_buffer_size DeepSpeed asserts when it first
// saves; here it is a ConfigError naming the key.
CheckpointWriterConfig parse_checkpoint_writer(ConfigReader r) {
  CheckpointWriterConfig c;
  c.type = upper(r.get_string("type", c.type));
  check_one_of(r, "type", c.type, {"MOCK", "PYTHON", "FAST"});
  c.decoupled = r.get_bool("decoupled", c.decoupled);
  c.io_buffer_size = r.get_int("io_buffer_size", c.io_buffer_size, 1);
  c.io_buffer_double = r.get_bool("io_buffer_double", c.io_buffer_double);
  c.show_statistics = r.get_bool("show_statistics", c.show_statistics);
  if (auto unit = r.get_opt_string("data_parallel")) {
    c.data_parallel = upper(*unit);
    check_one_of(r, "data_parallel", *c.data_parallel, {"REPLICA", "SOCKET", "MACHINE"});
    r.warn("data_parallel", "\"" + *c.data_parallel +
                                "\" (DeepSpeed's data-parallel slicing of the replicated files "
                                "into per-writer parts) is not supported: one replica writes "
                                "each file whole, in the layout torch.load reads");
  }
  c.io_multiplier = r.get_int("io_multiplier", c.io_multiplier, 1);
  if (c.io_multiplier != 1) {
    r.warn("io_multiplier", "is used only with data_parallel slicing, which is not supported; "
                            "ignored");
  }
  constexpr int64_t kAlignment = 4096;  // O_DIRECT's block (aio::kDirectIoAlignment)
  const int64_t unit = c.io_buffer_double ? 2 * kAlignment : kAlignment;
  if (c.type == "FAST" && c.io_buffer_size % unit != 0) {
    r.fail("io_buffer_size", "is " + std::to_string(c.io_buffer_size) + "; the FAST writer " +
                                 (c.io_buffer_double ? "splits it into two O_DIRECT buffers, so "
                                                       "it must be a multiple of 8192"
                                                     : "stages O_DIRECT writes in it, so it "
                                                       "must be a multiple of 4096"));
  }
  r.finish();
  return c;
}

CheckpointConfig parse_checkpoint(ConfigReader r, std::vector<std::string>* warnings) {
  CheckpointConfig c;
  const std::string up = upper(r.get_string("tag_validation", c.tag_validation));
  check_one_of(r, "tag_validation", up, {"IGNORE", "WARN", "FAIL"});
  c.tag_validation = up;
  c.load_universal = r.get_bool("load_universal", c.load_universal);
  c.use_node_local_storage = r.get_bool("use_node_local_storage", c.use_node_local_storage);
  ConfigReader pw = r.section("parallel_write", Strictness::kWarnUnknown);
  c.parallel_write_pipeline_stage = pw.get_bool("pipeline_stage", false);
  pw.finish();
  if (!r.get_bool("checkpoint_serialization", true)) {
    // DeepSpeed's false writes torch.save's legacy (pre-1.6) format; both read the zip format.
    warnings->push_back(r.where("checkpoint_serialization") +
                        " false (torch.save's legacy format) is not supported: checkpoints are "
                        "written in the zip format, which DeepSpeed and PyTorch read alike");
  }
  if (r.has("writer") && r.get_raw("writer", "an object") != nullptr) {
    c.writer = parse_checkpoint_writer(r.section("writer", Strictness::kStrict));
  }
  r.finish();
  return c;
}

// Matches DeepSpeed, where only BF16_Optimizer reads bf16.immediate_grad_update: ZeRO stage 1
// with fp32 gradient accumulation and no offload (Note [fp32 gradient accumulation]), and bf16
// pipelines at stage 0. Elsewhere DeepSpeed ignores it silently; here a warning says so (at
// stage 0 the engine warns, which knows whether it runs a pipeline).
void warn_if_immediate_grad_update_idle(DeepSpeedConfig& c) {
  if (!c.bf16.immediate_grad_update) return;
  const auto& z = c.zero_optimization;
  if (!c.bf16.enabled) {
    c.warnings.push_back(c.source + ": bf16.immediate_grad_update has no effect without "
                         "bf16.enabled");
    return;
  }
  const bool bf16_optimizer = z.stage == 1 && c.data_types.grad_accum_dtype == "fp32" &&
                              z.optimizer_offload() == OffloadDevice::kNone;
  if (bf16_optimizer || z.stage == 0) return;
  c.warnings.push_back(
      c.source + ": bf16.immediate_grad_update has no effect here (as in DeepSpeed): only the " +
      "fp32 gradient sums of zero_optimization.stage 1 with data_types.grad_accum_dtype " +
      "\"fp32\" and no offload_optimizer, and of pipelines at stage 0, use it; stage is " +
      std::to_string(z.stage));
}

}  // namespace

DeepSpeedConfig DeepSpeedConfig::from_string(const std::string& config, int64_t dp_world_size) {
  auto loaded = config_detail::load_config_text(config);
  return from_json(loaded.doc, dp_world_size, loaded.source);
}

DeepSpeedConfig DeepSpeedConfig::from_json(const json& doc, int64_t dp_world_size,
                                           const std::string& source) {
  DS_CHECK(doc.is_object(), ConfigError, source, ": the top level must be a JSON object, found ",
           doc.type_name());
  DeepSpeedConfig c;
  c.raw = doc;
  c.source = source;
  ConfigReader top(&c.raw, "", source, Strictness::kWarnUnknown, &c.warnings);

  // Elasticity sets the batch triad itself, so it is read first (as in DeepSpeed).
  ConfigReader elastic = top.section("elasticity", Strictness::kWarnUnknown);
  c.elasticity = config_detail::parse_elasticity(elastic);
  c.batch = c.elasticity.enabled
                ? config_detail::elastic_batch_triad(top, c, dp_world_size)
                : config_detail::read_batch_triad(top, dp_world_size, source, &c.notes);

  ConfigReader opt = top.section("optimizer", Strictness::kWarnUnknown);
  if (opt.present()) {
    c.optimizer.present = true;
    auto type = opt.get_opt_string("type");
    if (!type) opt.fail("type", "is missing; name the optimizer, e.g. \"AdamW\"");
    c.optimizer.type = *type;
    ConfigReader params = opt.section("params", Strictness::kWarnUnknown);
    if (params.present()) c.optimizer.params = c.raw["optimizer"]["params"];
    c.optimizer.legacy_fusion = opt.get_bool("legacy_fusion", false);
    opt.finish();
  }
  ConfigReader sched = top.section("scheduler", Strictness::kWarnUnknown);
  if (sched.present()) {
    c.scheduler.present = true;
    auto type = sched.get_opt_string("type");
    if (!type) sched.fail("type", "is missing; name the scheduler, e.g. \"WarmupLR\"");
    c.scheduler.type = *type;
    ConfigReader params = sched.section("params", Strictness::kWarnUnknown);
    if (params.present()) c.scheduler.params = c.raw["scheduler"]["params"];
    sched.finish();
  }

  c.gradient_clipping = top.get_double("gradient_clipping", c.gradient_clipping);
  if (c.gradient_clipping < 0) top.fail("gradient_clipping", "is negative; use 0 to disable");
  c.steps_per_print = top.get_opt_int("steps_per_print", 1);
  c.wall_clock_breakdown = top.get_bool("wall_clock_breakdown", false);
  c.memory_breakdown = top.get_bool("memory_breakdown", false);
  c.dump_state = top.get_bool("dump_state", false);
  c.log_level = top.get_string("log_level", "");
  c.prescale_gradients = top.get_bool("prescale_gradients", false);
  c.gradient_predivide_factor = top.get_double("gradient_predivide_factor", 1.0);
  if (c.gradient_predivide_factor <= 0) top.fail("gradient_predivide_factor", "must be > 0");
  c.gradient_allreduce_op = lower(top.get_string("gradient_allreduce_op", "mean"));
  check_one_of(top, "gradient_allreduce_op", c.gradient_allreduce_op, {"mean", "sum"});
  // DeepSpeed's get_communication_data_type: fp32, fp16 or bf16, any case.
  const auto comm_dtype = [&](const char* key) -> std::optional<std::string> {
    auto given = top.get_opt_string(key);
    if (!given) return std::nullopt;
    std::string v = lower(*given);
    if (v != "fp32" && v != "fp16" && v != "bf16") {
      top.fail(key, "is \"" + *given + "\"; supported data types: fp16, bf16, fp32");
    }
    return v;
  };
  c.communication_data_type = comm_dtype("communication_data_type");
  c.sequence_parallel_size = top.get_int("sequence_parallel_size", 1, 1);
  c.data_parallel_size = top.get_opt_int("data_parallel_size", 1);
  if (auto v = comm_dtype("seq_parallel_communication_data_type")) {
    c.seq_parallel_communication_data_type = *v;
  }
  c.managed_gradient_accumulation = top.get_bool("managed_gradient_accumulation", true);
  c.zero_allow_untested_optimizer = top.get_bool("zero_allow_untested_optimizer", false);
  c.zero_force_ds_cpu_optimizer = top.get_bool("zero_force_ds_cpu_optimizer", true);
  c.dataloader_drop_last = top.get_bool("dataloader_drop_last", false);
  c.sparse_gradients = top.get_bool("sparse_gradients", false);
  c.seed = top.get_opt_int("seed", 0);

  c.fp16 = parse_fp16(top.section("fp16", Strictness::kStrict));
  if (top.has("bf16") && top.has("bfloat16")) {
    top.fail("bf16", "and its legacy name 'bfloat16' are both set; keep bf16");
  }
  c.bf16 = parse_bf16(top.section(top.has("bfloat16") ? "bfloat16" : "bf16", Strictness::kStrict));
  top.mark_known("bf16");
  top.mark_known("bfloat16");
  if (c.fp16.enabled && c.bf16.enabled) {
    throw ConfigError(source + ": bf16 and fp16 modes cannot be simultaneously enabled");
  }
  c.zero_optimization = parse_zero(top, &c.warnings);
  config_detail::check_low_precision_masters(c);
  if (c.gradient_allreduce_op == "sum" && c.zero_optimization.stage == 3) {
    top.fail("gradient_allreduce_op", "is \"sum\"; it is not supported with ZeRO stage 3");
  }
  c.tensorboard = parse_monitor(top.section("tensorboard", Strictness::kStrict));
  c.csv_monitor = parse_monitor(top.section("csv_monitor", Strictness::kStrict));
  c.wandb = parse_wandb(top.section("wandb", Strictness::kStrict));
  c.comet_enabled = parse_comet(top.section("comet", Strictness::kStrict));
  c.comms_logger = parse_comms_logger(top.section("comms_logger", Strictness::kStrict));
  ConfigReader timers = top.section("timers", Strictness::kWarnUnknown);
  ConfigReader tp = timers.section("throughput", Strictness::kStrict);
  c.timers_throughput.enabled = tp.get_bool("enabled", true);
  c.timers_throughput.synchronized = tp.get_bool("synchronized", true);
  tp.finish();
  timers.finish();
  c.checkpoint =
      parse_checkpoint(top.section("checkpoint", Strictness::kWarnUnknown), &c.warnings);
  config_detail::parse_feature_sections(top, c);
  warn_if_immediate_grad_update_idle(c);
  config_detail::parse_curriculum_learning(top, c);
  config_detail::parse_data_efficiency(top, c);
  config_detail::parse_hybrid_engine(top, c);
  // Checked here; read with AutotuningConfig::of(config) by the engine and the tuner.
  AutotuningConfig::from_json(top.get_raw("autotuning", "an object"), source);
  config_detail::parse_unimplemented_sections(top, c);
  top.finish();
  return c;
}

const char* offload_device_name(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kCpu: return "cpu";
    case OffloadDevice::kNvme: return "nvme";
    case OffloadDevice::kNone: break;
  }
  return "none";
}

}  // namespace deepspeed

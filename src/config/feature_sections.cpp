// Feature sections: typed parsing with DeepSpeed's defaults (reference §1.3, §9).
#include "config/feature_sections.h"

#include "deepspeed/autotuning_config.h"

#include <algorithm>
#include <cctype>

namespace deepspeed::config_detail {
namespace {

// DeepSpeed accepts several spellings of each dtype ("half", "torch.float16", ...).
std::string normalize_dtype(ConfigReader& r, const std::string& key) {
  auto v = r.get_opt_string(key);
  if (!v) return "";
  std::string s = *v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "fp16" || s == "float16" || s == "half") return "fp16";
  if (s == "bf16" || s == "bfloat16") return "bf16";
  if (s == "fp32" || s == "float32" || s == "float") return "fp32";
  r.fail(key, "is \"" + *v + "\"; expected fp16, bf16 or fp32");
}

}  // namespace

void parse_feature_sections(ConfigReader& top, DeepSpeedConfig& c) {
  {
    ConfigReader r = top.section("activation_checkpointing", Strictness::kWarnUnknown);
    auto& a = c.activation_checkpointing;
    a.partition_activations = r.get_bool("partition_activations", false);
    a.cpu_checkpointing = r.get_bool("cpu_checkpointing", false);
    a.contiguous_memory_optimization = r.get_bool("contiguous_memory_optimization", false);
    a.number_checkpoints = r.get_opt_int("number_checkpoints", 1);
    a.synchronize_checkpoint_boundary = r.get_bool("synchronize_checkpoint_boundary", false);
    a.profile = r.get_bool("profile", false);
    // DeepSpeed asserts both in checkpointing.configure(); checked here as well, so that the
    // config is refused before training starts (configure() checks again after its overrides).
    if (a.contiguous_memory_optimization && !a.partition_activations) {
      r.fail("contiguous_memory_optimization", "is true but partition_activations is false; the "
             "contiguous buffers hold partitions, so set partition_activations to true");
    }
    if (a.contiguous_memory_optimization && !a.number_checkpoints) {
      r.fail("contiguous_memory_optimization", "is true but number_checkpoints is not set; set it "
             "to the number of checkpointed calls per forward (the buffers' slot count)");
    }
    r.finish();
  }
  {
    ConfigReader r = top.section("flops_profiler", Strictness::kWarnUnknown);
    auto& f = c.flops_profiler;
    f.enabled = r.get_bool("enabled", false);
    f.recompute_fwd_factor = r.get_double("recompute_fwd_factor", 0.0);
    f.profile_step = r.get_int("profile_step", 1, 1);
    f.module_depth = r.get_int("module_depth", -1);
    f.top_modules = r.get_int("top_modules", 1, 1);
    f.detailed = r.get_bool("detailed", true);
    f.output_file = r.get_string("output_file", "");
    r.finish();
  }
  {
    ConfigReader r = top.section("aio", Strictness::kWarnUnknown);
    auto& a = c.aio;
    a.block_size = r.get_int("block_size", a.block_size, 1);
    a.queue_depth = r.get_int("queue_depth", a.queue_depth, 1);
    if (r.has("thread_count")) {
      if (r.has("intra_op_parallelism")) {
        r.fail("thread_count", "and its replacement intra_op_parallelism are both set");
      }
      a.intra_op_parallelism = r.get_int("thread_count", 1, 1);
      c.warnings.push_back(r.where("thread_count") + " is deprecated; use intra_op_parallelism");
    }
    a.intra_op_parallelism = r.get_int("intra_op_parallelism", a.intra_op_parallelism, 1);
    a.single_submit = r.get_bool("single_submit", false);
    a.overlap_events = r.get_bool("overlap_events", true);
    a.use_gds = r.get_bool("use_gds", false);
    r.finish();
  }
  {
    ConfigReader r = top.section("pipeline", Strictness::kWarnUnknown);
    auto& p = c.pipeline;
    // "auto" is DeepSpeed's own value here (the pipeline module decides), not a placeholder.
    if (r.take_auto("stages")) {
      p.stages = "auto";
    } else if (const json* st = r.get_raw("stages", "a positive integer")) {
      if (!st->is_number_integer() || st->get<int64_t>() < 1) {
        r.fail("stages", "is " + show(*st) + "; expected \"auto\" or a positive integer");
      }
      p.stages = std::to_string(st->get<int64_t>());
    }
    p.partition = r.get_string("partition", "best");
    p.seed_layers = r.get_bool("seed_layers", false);
    p.activation_checkpoint_interval = r.get_int("activation_checkpoint_interval", 0, 0);
    p.pipe_partitioned = r.get_bool("pipe_partitioned", true);
    p.grad_partitioned = r.get_bool("grad_partitioned", true);
    r.finish();
  }
  {
    ConfigReader r = top.section("data_types", Strictness::kWarnUnknown);
    c.data_types.grad_accum_dtype = normalize_dtype(r, "grad_accum_dtype");
    c.data_types.param_dtype = normalize_dtype(r, "param_dtype");
    c.data_types.buffer_dtype = normalize_dtype(r, "buffer_dtype");
    const std::string mode = c.fp16.enabled ? "fp16" : c.bf16.enabled ? "bf16" : "fp32";
    if (!c.data_types.param_dtype.empty() && c.data_types.param_dtype != mode) {
      r.fail("param_dtype", "is " + c.data_types.param_dtype + " but the precision mode is " +
                                mode + " (set by fp16/bf16.enabled)");
    }
    r.finish();
  }
  {
    ConfigReader r = top.section("progressive_layer_drop", Strictness::kWarnUnknown);
    auto& p = c.progressive_layer_drop;
    p.enabled = r.get_bool("enabled", false);
    if (p.enabled && (!r.has("theta") || !r.has("gamma"))) {
      r.fail(r.has("theta") ? "gamma" : "theta", "is required when progressive_layer_drop is enabled");
    }
    p.theta = r.get_double("theta", p.theta);
    p.gamma = r.get_double("gamma", p.gamma);
    r.finish();
  }
  {
    ConfigReader r = top.section("torch_autocast", Strictness::kWarnUnknown);
    auto& t = c.torch_autocast;
    t.enabled = r.get_bool("enabled", false);
    t.dtype = normalize_dtype(r, "dtype");
    if (t.dtype == "fp32") {
      r.fail("dtype", "is fp32; autocast casts to a lower precision, fp16 or bf16");
    }
    t.lower_precision_safe_modules = r.get_string_list("lower_precision_safe_modules");
    r.finish();
  }
  // aio drives NVMe offload (stage 3); without it the section changes nothing.
  const auto& z = c.zero_optimization;
  const bool nvme = z.stage == 3 && (z.optimizer_offload() == OffloadDevice::kNvme ||
                                     z.param_offload() == OffloadDevice::kNvme);
  if (top.has("aio") && !nvme) {
    c.warnings.push_back(top.where("aio") + " has no effect: it configures NVMe offload "
                         "(zero_optimization stage 3 with offload_optimizer or offload_param "
                         "device \"nvme\"), which this config does not use");
  }
}

void resolve_feature_sections(const DeepSpeedConfig& c, json& j) {
  const auto& a = c.activation_checkpointing;
  j["activation_checkpointing"] = {
      {"partition_activations", a.partition_activations},
      {"cpu_checkpointing", a.cpu_checkpointing},
      {"contiguous_memory_optimization", a.contiguous_memory_optimization},
      {"number_checkpoints", a.number_checkpoints ? json(*a.number_checkpoints) : json()},
      {"synchronize_checkpoint_boundary", a.synchronize_checkpoint_boundary},
      {"profile", a.profile}};
  j["autotuning"] = AutotuningConfig::of(c).to_json();
  const auto& f = c.flops_profiler;
  j["flops_profiler"] = {{"enabled", f.enabled},           {"recompute_fwd_factor", f.recompute_fwd_factor},
                         {"profile_step", f.profile_step}, {"module_depth", f.module_depth},
                         {"top_modules", f.top_modules},   {"detailed", f.detailed},
                         {"output_file", f.output_file.empty() ? json() : json(f.output_file)}};
  const auto& io = c.aio;
  j["aio"] = {{"block_size", io.block_size},         {"queue_depth", io.queue_depth},
              {"intra_op_parallelism", io.intra_op_parallelism},
              {"single_submit", io.single_submit},   {"overlap_events", io.overlap_events},
              {"use_gds", io.use_gds}};
  const auto& p = c.pipeline;
  j["pipeline"] = {{"stages", p.stages},
                   {"partition", p.partition},
                   {"seed_layers", p.seed_layers},
                   {"activation_checkpoint_interval", p.activation_checkpoint_interval},
                   {"pipe_partitioned", p.pipe_partitioned},
                   {"grad_partitioned", p.grad_partitioned}};
  auto opt = [](const std::string& s) { return s.empty() ? json() : json(s); };
  j["data_types"] = {{"grad_accum_dtype", opt(c.data_types.grad_accum_dtype)},
                     {"param_dtype", opt(c.data_types.param_dtype)},
                     {"buffer_dtype", opt(c.data_types.buffer_dtype)}};
  const auto& e = c.elasticity;
  j["elasticity"] = {{"enabled", e.enabled},
                     {"max_train_batch_size", e.max_train_batch_size},
                     {"micro_batch_sizes", e.micro_batch_sizes},
                     {"min_gpus", e.min_gpus},
                     {"max_gpus", e.max_gpus},
                     {"min_time", e.min_time},
                     {"prefer_larger_batch", e.prefer_larger_batch},
                     {"num_gpus_per_node", e.num_gpus_per_node},
                     {"model_parallel_size", e.model_parallel_size},
                     {"ignore_non_elastic_batch_info", e.ignore_non_elastic_batch_info},
                     {"version", e.version}};
  j["progressive_layer_drop"] = {{"enabled", c.progressive_layer_drop.enabled},
                                 {"theta", c.progressive_layer_drop.theta},
                                 {"gamma", c.progressive_layer_drop.gamma}};
  resolve_curriculum_learning(c, j);
  resolve_data_efficiency(c, j);
  resolve_hybrid_engine(c, j);
  j["torch_autocast"] = {{"enabled", c.torch_autocast.enabled},
                         {"dtype", opt(c.torch_autocast.dtype)},
                         {"lower_precision_safe_modules", c.torch_autocast.lower_precision_safe_modules}};
}

}  // namespace deepspeed::config_detail

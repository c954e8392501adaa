// DeepSpeedConfig: ds_config.json parsed into typed sections with DeepSpeed's key names and
// defaults (DeepSpeed 0.19.6). Field names repeat the JSON keys verbatim so DeepSpeed's docs read
// true. Parsing checks types and cross-field rules; check_supported() refuses, by name, features
// this build does not implement yet. See docs/config.md for the full key table.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deepspeed/errors.h"

namespace deepspeed {

using json = nlohmann::json;

/// The batch triad after inference (§ train_batch_size = micro * accumulation * dp world size).
struct BatchConfig {
  int64_t train_batch_size = 0;                // samples per optimizer step, all ranks together
  int64_t train_micro_batch_size_per_gpu = 0;  // samples per forward on one rank
  int64_t gradient_accumulation_steps = 0;     // micro-batches per optimizer step
  int64_t dp_world_size = 1;                   // data-parallel ranks the triad was resolved for
};

/// `optimizer`: {type, params}. `params` are kept as JSON and checked by the optimizer factory,
/// which knows each optimizer's keyword arguments (DeepSpeed forwards them as kwargs).
struct OptimizerConfig {
  bool present = false;
  std::string type;          // as written; matched case-insensitively for DeepSpeed names
  json params = json::object();
  bool legacy_fusion = false;
};

/// `scheduler`: {type, params}; params checked by the scheduler factory.
struct SchedulerConfig {
  bool present = false;
  std::string type;
  json params = json::object();
};

/// `fp16` (precision_config.py). loss_scale 0 means dynamic scaling.
struct Fp16Config {
  bool enabled = false;
  bool auto_cast = false;
  double loss_scale = 0.0;
  int64_t initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int64_t hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;
  bool fp16_master_weights_and_grads = false;
};

/// `bf16` (alias `bfloat16`).
struct Bf16Config {
  bool enabled = false;
  bool immediate_grad_update = false;
  bool check_grad_overflow = true;  // was false before DeepSpeed 0.19.4
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
};

/// `offload_optimizer.device` / `offload_param.device`, parsed once from "none" | "cpu" | "nvme"
/// (any case); an other value is a ConfigError naming the key and the allowed values.
enum class OffloadDevice { kNone, kCpu, kNvme };

/// The config spelling: "none", "cpu" or "nvme" (messages, the resolved config).
const char* offload_device_name(OffloadDevice device);

/// `zero_optimization.offload_optimizer`.
struct OffloadOptimizerConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pin_memory = true;
  bool pipeline_read = false;
  bool pipeline_write = false;
  bool fast_init = false;
  double ratio = 1.0;
  bool super_offload = false;
  double cpuadam_cores_perc = 0.8;
};

/// `zero_optimization.offload_param` (stage 3 only).
struct OffloadParamConfig {
  OffloadDevice device = OffloadDevice::kNone;
  std::string nvme_path;
  int64_t buffer_count = 5;
  int64_t buffer_size = 100000000;
  int64_t max_in_cpu = 1000000000;
  bool pin_memory = true;
};

/// `zero_optimization.zeropp_loco_param`: LoCo's error feedback for qgZ (Note [LoCo error
/// feedback] in runtime/zero/loco_error_feedback.h).
struct LocoConfig {
  double err_beta = 0.8;  // the carried error's weight when a new one is blended in
  int64_t reset_T = 1024;  // a bucket's errors restart from zero every reset_T + 1 reductions
};

/// `zero_optimization` (zero/config.py). Sizes are in elements, not bytes.
struct ZeroConfig {
  int64_t stage = 0;
  bool contiguous_gradients = true;
  bool reduce_scatter = true;
  int64_t reduce_bucket_size = 500000000;  // 0: every gradient is reduced on its own
  bool use_multi_rank_bucket_allreduce = true;
  bool allgather_partitions = true;
  int64_t allgather_bucket_size = 500000000;
  std::optional<bool> overlap_comm;  // unset => true for stage 3, false otherwise
  bool load_from_fp32_weights = true;
  bool elastic_checkpoint = false;
  std::optional<OffloadParamConfig> offload_param;
  std::optional<OffloadOptimizerConfig> offload_optimizer;
  int64_t sub_group_size = 1000000000;
  int64_t stage3_prefetch_bucket_size = 50000000;
  int64_t stage3_param_persistence_threshold = 100000;
  int64_t stage3_model_persistence_threshold = INT64_MAX;
  int64_t stage3_max_live_parameters = 1000000000;
  int64_t stage3_max_reuse_distance = 1000000000;
  bool stage3_gather_16bit_weights_on_model_save = false;
  int64_t stage3_module_granularity_threshold = 0;
  bool stage3_use_all_reduce_for_fetch_params = false;
  bool stage3_allgather_sequential = false;
  bool ignore_unused_parameters = true;
  bool round_robin_gradients = false;
  int64_t zero_hpz_partition_size = 1;
  bool zero_quantized_weights = false;
  bool zero_quantized_nontrainable_weights = false;
  bool zero_quantized_gradients = false;
  std::optional<LocoConfig> zeropp_loco_param;  // read with qgZ at stage 3 only
  int64_t mics_shard_size = -1;
  bool mics_hierarchical_params_gather = false;
  bool memory_efficient_linear = true;
  bool override_module_apply = true;
  bool pipeline_loading_checkpoint = false;
  bool log_trace_cache_warnings = false;
  bool enable_sanity_checks = false;
  bool zenflow = false;  // a `zenflow` section is given (ZenFlow; refused by check_supported())
  /// Size keys given as "auto" (Hugging Face's placeholder), of reduce_bucket_size,
  /// stage3_prefetch_bucket_size and stage3_param_persistence_threshold; initialize() fills them
  /// from the model's hidden size as the Hugging Face integration does (docs/config.md "auto").
  std::vector<std::string> auto_sizes;

  bool overlap_comm_enabled() const { return overlap_comm.value_or(stage == 3); }
  /// offload_optimizer.device, kNone when the section is absent.
  OffloadDevice optimizer_offload() const {
    return offload_optimizer ? offload_optimizer->device : OffloadDevice::kNone;
  }
  /// offload_param.device, kNone when the section is absent.
  OffloadDevice param_offload() const {
    return offload_param ? offload_param->device : OffloadDevice::kNone;
  }
  /// Elements per gradient bucket: reduce_bucket_size, where 0 means one gradient per bucket
  /// (DeepSpeed closes a bucket whenever the next gradient would exceed the size).
  int64_t reduce_bucket_numel() const { return reduce_bucket_size > 0 ? reduce_bucket_size : 1; }
};

/// `tensorboard` / `csv_monitor`.
struct MonitorConfig {
  bool enabled = false;
  std::string output_path;
  std::string job_name = "DeepSpeedJobName";
};

/// `wandb`.
struct WandbConfig {
  bool enabled = false;
  std::string group, team;
  std::string project = "deepspeed";
};

/// `comms_logger`.
struct CommsLoggerConfig {
  bool enabled = false;
  bool verbose = false;
  bool prof_all = true;
  std::vector<std::string> prof_ops;
  bool debug = false;
};

/// `timers.throughput`.
struct ThroughputTimerConfig {
  bool enabled = true;
  bool synchronized = true;
};

/// `checkpoint.writer` (DeepSpeed's FastPersist writers; docs/checkpoints.md "Writers").
struct CheckpointWriterConfig {
  std::string type = "FAST";  // MOCK | PYTHON | FAST (upper-cased, as DeepSpeed)
  bool decoupled = false;     // files written in the background, committed at the next step
  int64_t io_buffer_size = 64LL << 20;  // FAST: bytes staged per O_DIRECT write (both halves)
  bool io_buffer_double = true;         // FAST: fill one half while the other is written
  bool show_statistics = false;         // each written file's bytes, seconds and GB/s
  std::optional<std::string> data_parallel;  // REPLICA | SOCKET | MACHINE: warned, not used
  int64_t io_multiplier = 1;                 // with data_parallel only: warned, not used
};

/// `checkpoint` (legacy dict section: unknown keys warn).
struct CheckpointConfig {
  std::string tag_validation = "WARN";  // IGNORE | WARN | FAIL
  bool load_universal = false;
  bool use_node_local_storage = false;
  bool parallel_write_pipeline_stage = false;  // checkpoint.parallel_write.pipeline_stage
  /// Absent (DeepSpeed's default): the standard writer, as PYTHON without statistics.
  std::optional<CheckpointWriterConfig> writer;
};

/// `activation_checkpointing` (legacy dict section; applied by the user's checkpoint calls).
struct ActivationCheckpointingConfig {
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  std::optional<int64_t> number_checkpoints;
  bool synchronize_checkpoint_boundary = false;
  bool profile = false;
};

/// `flops_profiler`.
struct FlopsProfilerConfig {
  bool enabled = false;
  double recompute_fwd_factor = 0.0;
  int64_t profile_step = 1;
  int64_t module_depth = -1;
  int64_t top_modules = 1;
  bool detailed = true;
  std::string output_file;  // empty: stdout
};

/// `aio` (async I/O for NVMe offload).
struct AioConfig {
  int64_t block_size = 1048576;
  int64_t queue_depth = 8;
  int64_t intra_op_parallelism = 1;  // legacy name: thread_count
  bool single_submit = false;
  bool overlap_events = true;
  bool use_gds = false;
};

/// `pipeline` (read by pipeline-parallel engines).
struct PipelineConfig {
  std::string stages = "auto";
  std::string partition = "best";
  bool seed_layers = false;
  int64_t activation_checkpoint_interval = 0;
  bool pipe_partitioned = true;
  bool grad_partitioned = true;
};

/// `data_types`: "fp16" | "bf16" | "fp32" (or torch spellings), normalized; empty = unset.
struct DataTypesConfig {
  std::string grad_accum_dtype, param_dtype, buffer_dtype;
};

/// `elasticity`.
struct ElasticityConfig {
  bool enabled = false;
  int64_t max_train_batch_size = 2000;
  std::vector<int64_t> micro_batch_sizes = {2, 4, 6};
  int64_t min_gpus = 1;
  int64_t max_gpus = 10000;
  double min_time = 0;
  bool prefer_larger_batch = true;
  int64_t num_gpus_per_node = 1;
  int64_t model_parallel_size = 1;
  bool ignore_non_elastic_batch_info = false;
  double version = 0.2;
};

/// `progressive_layer_drop`: theta and gamma are required when enabled.
struct ProgressiveLayerDropConfig {
  bool enabled = false;
  double theta = 1.0;
  double gamma = 0.001;
};

/// `curriculum_learning`: DeepSpeed's legacy curriculum learning (the data_efficiency section
/// supersedes it). The difficulty rises from min_difficulty to max_difficulty over the global
/// steps; with curriculum_type "seqlen" the engine hands it to the model's forward as
/// curriculum_seqlen (ForwardKwargs). Read only when enabled, as DeepSpeed does.
struct CurriculumLearningConfig {
  bool enabled = false;
  std::string curriculum_type;  // "seqlen" is passed to forward; any other is the user's to read
  int64_t min_difficulty = 0;
  int64_t max_difficulty = 0;
  std::string schedule_type;    // fixed_linear | fixed_root | fixed_discrete | custom
  // schedule_config, fixed_linear / fixed_root:
  int64_t total_curriculum_step = 0;  // steps from min_difficulty to max_difficulty
  int64_t difficulty_step = 1;        // every difficulty is a multiple of it
  double root_degree = 1;             // fixed_root only (1: linear)
  // schedule_config, fixed_discrete: difficulty[i] up to step max_step[i], then the last one.
  std::vector<int64_t> difficulty;
  std::vector<int64_t> max_step;
};

/// `data_efficiency.data_routing.random_ltd`: random layerwise token dropping (Yao et al.,
/// "Random-LTD", 2022). Each training forward, the layers named by random_ltd_layer_id run on a
/// random, order-keeping subset of reserved_length tokens (rising from min_value to max_value
/// over require_steps steps); the others pass through them. The model applies it with
/// RandomLayerTokenDrop (random_ltd.h). As in DeepSpeed, random_ltd.enabled alone turns it on.
struct RandomLtdConfig {
  bool enabled = false;
  int64_t total_layer_num = 0;       // the model's layers, dropping or not
  int64_t random_ltd_layer_num = 0;  // == random_ltd_layer_id.size()
  std::vector<int64_t> random_ltd_layer_id;  // sorted, each in [0, total_layer_num)
  std::optional<std::string> model_mask_name;  // the attention mask the layers take (or none)
  std::string model_type;          // "decoder": causal mask cut; "encoder": mask gathered
  std::string hidden_state_order;  // "batch_seq_dim" | "seq_batch_dim"
  // random_ltd_schedule:
  int64_t min_value = 0;   // reserved tokens at step 0
  int64_t max_value = 0;   // ... from require_steps on (no dropping at the full length)
  std::string schedule_type = "fixed_linear";  // the only one DeepSpeed implements
  int64_t require_steps = 1;  // schedule_config: steps from min_value to max_value
  int64_t seq_per_step = 1;   // schedule_config: every reserved length is a multiple of it
};

/// `data_efficiency`: DeepSpeed's data-efficiency library. Its data_routing part (random-LTD)
/// is implemented; an enabled data_sampling (curriculum by difficulty metrics, dynamic
/// batching) is refused by name.
struct DataEfficiencyConfig {
  bool enabled = false;
  int64_t seed = 1234;
  bool data_routing_enabled = false;
  RandomLtdConfig random_ltd;
};

/// `hybrid_engine`: DeepSpeed's hybrid engine (DeepSpeed-Chat's RLHF actor): one engine that
/// trains and generates. Engine::generate_with() runs a generation with every ZeRO-3 parameter
/// gathered once (pin_parameters) instead of per layer and forward, and eval() prints the
/// latency breakdown DeepSpeed prints. DeepSpeed's inference kernels (and so its inference
/// workspace and inference tensor parallelism) are not part of this build.
struct HybridEngineConfig {
  bool enabled = false;
  int64_t max_out_tokens = 512;         // the inference kernels' workspace (no effect here)
  int64_t inference_tp_size = 1;        // > 1 refused
  bool release_inference_cache = false;  // the inference workspace (no effect here; warns)
  bool pin_parameters = true;           // ZeRO-3: gather all layers once per generation
  int64_t tp_gather_partition_size = 8;  // layers gathered at once with inference_tp_size > 1
  bool enable_cuda_graph = false;       // refused
};

/// `torch_autocast`.
struct TorchAutocastConfig {
  bool enabled = false;
  std::string dtype;
  std::vector<std::string> lower_precision_safe_modules;
};

/// Everything in ds_config.json. `raw` is the user's JSON verbatim (saved into checkpoints as
/// `ds_config`, as DeepSpeed does).
struct DeepSpeedConfig {
  json raw = json::object();
  std::string source = "ds_config";  // file path, or "ds_config" for JSON text/objects

  BatchConfig batch;
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;

  double gradient_clipping = 1.0;        // global L2 norm; 0 disables (was 0.0 before 0.19.4)
  std::optional<int64_t> steps_per_print;  // None: no progress lines (was 10 before 0.15.2)
  bool wall_clock_breakdown = false;
  bool memory_breakdown = false;
  bool dump_state = false;
  std::string log_level;
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  std::string gradient_allreduce_op = "mean";  // mean | sum (lower-cased)
  std::optional<std::string> communication_data_type;  // fp32 | fp16 | bf16
  /// DeepSpeed-Ulysses: ranks per sequence-parallel group (consecutive ranks); the batch triad
  /// counts world / sequence_parallel_size data-parallel ranks. See docs/sequence_parallel.md.
  int64_t sequence_parallel_size = 1;
  /// What gradients travel in when sequence_parallel_size > 1 (replaces
  /// communication_data_type there, as in DeepSpeed): fp32 | fp16 | bf16.
  std::string seq_parallel_communication_data_type = "fp32";
  /// The data-parallel size of DeepSpeed's (data, sequence) device mesh; when given with
  /// sequence_parallel_size their product must be the world size.
  std::optional<int64_t> data_parallel_size;
  bool managed_gradient_accumulation = true;
  bool zero_allow_untested_optimizer = false;
  bool zero_force_ds_cpu_optimizer = true;
  bool dataloader_drop_last = false;
  bool sparse_gradients = false;
  std::optional<int64_t> seed;  // seeds torch's generator in initialize() when given

  Fp16Config fp16;
  Bf16Config bf16;
  ZeroConfig zero_optimization;
  MonitorConfig tensorboard;
  MonitorConfig csv_monitor;
  WandbConfig wandb;
  CommsLoggerConfig comms_logger;
  ThroughputTimerConfig timers_throughput;
  CheckpointConfig checkpoint;
  ActivationCheckpointingConfig activation_checkpointing;
  FlopsProfilerConfig flops_profiler;
  AioConfig aio;
  PipelineConfig pipeline;
  DataTypesConfig data_types;
  ElasticityConfig elasticity;
  ProgressiveLayerDropConfig progressive_layer_drop;
  CurriculumLearningConfig curriculum_learning;
  DataEfficiencyConfig data_efficiency;
  TorchAutocastConfig torch_autocast;
  HybridEngineConfig hybrid_engine;

  bool comet_enabled = false;  // comet.enabled (refused by check_supported())
  /// Features of the sections this build parses only far enough to know whether they are on
  /// ("amp.enabled", "compression_training.sparse_pruning", ...), in order; check_supported()
  /// refuses the first.
  std::vector<std::string> unimplemented_requests;

  /// Warnings found while parsing (unknown top-level keys, deprecated keys, ...), in order.
  std::vector<std::string> warnings;
  /// How values given as "auto" were resolved (to what, and why), in order; printed like the
  /// warnings (ds_config on stderr, initialize() on rank 0).
  std::vector<std::string> notes;

  /// Parses `config`: a path to a JSON file, JSON text, or URL-safe base64 of JSON.
  /// `dp_world_size` resolves the batch triad. Throws ConfigError naming the key path and value.
  static DeepSpeedConfig from_string(const std::string& config, int64_t dp_world_size);
  /// Parses an already-loaded JSON object; `source` names it in error messages.
  static DeepSpeedConfig from_json(const json& config, int64_t dp_world_size,
                                   const std::string& source = "ds_config");

  /// Throws NotSupportedError naming the first key whose feature this build lacks
  /// ("zero_optimization.stage 3 is not supported yet").
  void check_supported() const;

  /// The resolved configuration: every section with defaults applied and the triad filled in.
  json resolved() const;
};

}  // namespace deepspeed

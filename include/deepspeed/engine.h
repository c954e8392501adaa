// Engine: DeepSpeed's training engine for any torch::nn::Module. forward / backward / step with
// DeepSpeed's semantics: the loss is divided by gradient_accumulation_steps; gradients are
// averaged across ranks by bucketed all-reduce launched from gradient hooks (overlapping the rest
// of backward) on the accumulation boundary only; then clipping by global norm, the optimizer,
// and the LR schedule. See docs/engine.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <new>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/autocast.h"
#include "deepspeed/checkpoint.h"
#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/forward_kwargs.h"
#include "deepspeed/lr_schedules.h"
#include "deepspeed/mpu.h"
#include "deepspeed/param_group.h"

namespace deepspeed {

class CurriculumScheduler;
class ProgressiveLayerDrop;
class RandomLtdScheduler;
namespace checkpoint {
class CheckpointWriter;
}  // namespace checkpoint
namespace compression {
class CompressionScheduler;
class MoqQuantizer;
}  // namespace compression

namespace monitor {
class MonitorMaster;
}
namespace profiling {
class FlopsProfiler;
}
namespace runtime {
class AutotuningProbe;
class HybridEngineState;
class LossScaler;
class ThroughputTimer;
class Timers;
class ZeroOptimizer;
struct ReductionStats;
struct ZeroCheckpointContext;
}  // namespace runtime

/// Per-rank memory figures, in bytes (CPU: resident set of this process).
struct MemoryStats {
  int64_t rss_bytes = 0;       // current resident set size
  int64_t peak_rss_bytes = 0;  // high-water mark of the resident set
  int64_t host_cached_bytes = 0;  // free CPU blocks the engine's allocator keeps for reuse
  int64_t device_allocated_bytes = 0;      // CUDA caching allocator, 0 on CPU
  int64_t device_max_allocated_bytes = 0;  // its peak
  int64_t device_reserved_bytes = 0;       // held by the caching allocator (0 on CPU)
  int64_t device_max_reserved_bytes = 0;   // its peak
  // What the engine holds for training (see docs/zero.md for the per-stage formula).
  int64_t param_bytes = 0;            // model parameters (flat buffers under ZeRO 1/2)
  int64_t master_param_bytes = 0;     // fp32 master weights kept apart from the parameters
  int64_t grad_bytes = 0;             // gradients held between backward and step
  int64_t optimizer_state_bytes = 0;  // optimizer state tensors (after the first step)
  int64_t comm_buffer_bytes = 0;      // gradient reduction buckets
  int64_t padding_elements = 0;       // alignment padding of the flat buffers
  int64_t offloaded_optimizer_bytes = 0;  // offload_optimizer: masters + state in host memory
  int64_t offloaded_param_bytes = 0;      // offload_param: parameter shards in host memory
  int64_t swap_buffer_bytes = 0;          // NVMe offload: host buffers sub-groups/shards pass through
  int64_t nvme_optimizer_bytes = 0;       // offload_optimizer "nvme": in swap files (stage 3)
  int64_t nvme_param_bytes = 0;           // offload_param "nvme": in swap files (stage 3)
  /// Where the training tensors above live: on the training device (the accelerator; the CPU in a
  /// CPU-only run) and in host memory because of offload. Gathered parameters count on the device.
  int64_t device_bytes() const;
  int64_t host_offload_bytes() const;
};

/// Keys merged into the model-states file at the top level (DeepSpeed's client_state).
using ClientState = std::vector<std::pair<std::string, c10::IValue>>;

/// Engine::load_checkpoint's switches (DeepSpeed's keyword arguments).
struct LoadCheckpointOptions {
  bool load_module_strict = true;        // missing/unexpected module keys are an error
  bool load_optimizer_states = true;     // fp32 masters + optimizer state (+ loss scaler)
  bool load_lr_scheduler_states = true;
  bool load_module_only = false;         // the weights alone: no optimizer, scheduler, counters
};

/// What load_checkpoint returns: DeepSpeed's (load_path, client_state).
struct LoadedCheckpoint {
  std::optional<std::string> load_path;  // "<dir>/<tag>"; nullopt when `latest` was missing
  /// Every top-level key of the model-states file that is not engine state (DeepSpeed's rule,
  /// checkpoint::client_state_of): the client_state given to save_checkpoint and a few
  /// informational keys (buffer_names, param_shapes, ds_config, ds_version, ...).
  checkpoint::Dict client_state = checkpoint::new_dict();
};

/// Makes an LR scheduler for the optimizer the engine uses (DeepSpeed's callable form).
using LRSchedulerFactory =
    std::function<std::unique_ptr<optim::LRScheduler>(torch::optim::Optimizer&)>;

class Engine {
 public:
  /// Prefer deepspeed::initialize(). `optimizer` overrides the config's `optimizer` section,
  /// `lr_scheduler` its `scheduler` section (as in DeepSpeed).
  /// `model_parameters`: param groups for the config's optimizer (default: one group of every
  /// trainable parameter). `mpu`: the data- and model-parallel groups (DeepSpeed's mpu);
  /// without one the job is data-parallel over the world. The config's batch triad must have
  /// been resolved for the data-parallel size.
  Engine(std::shared_ptr<torch::nn::Module> module, DeepSpeedConfig config,
         std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
         LRSchedulerFactory lr_scheduler = nullptr,
         std::vector<ParamGroup> model_parameters = {}, std::shared_ptr<Mpu> mpu = nullptr);
  virtual ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Runs `fn` (the model's forward) with the engine's forward timers and phase, under
  /// torch_autocast when the config enables it.
  template <typename Fn>
  auto forward_with(Fn&& fn) -> decltype(fn()) {
    forward_begin();
    auto out = [&] {
      std::optional<AutocastScope> autocast;
      enter_autocast(autocast);
      return with_memory_report("forward", std::forward<Fn>(fn));
    }();
    forward_end();
    return out;
  }

  /// Backpropagates `loss` (a scalar with a grad_fn) divided by gradient_accumulation_steps.
  /// On the accumulation boundary the gradients are all-reduced while backward runs and are
  /// averaged across ranks when this returns. Returns loss / gradient_accumulation_steps.
  /// Throws UsageError without an optimizer or for a non-scalar loss.
  at::Tensor backward(const at::Tensor& loss);

  /// Call after every micro-batch. On the accumulation boundary: clip, optimizer step,
  /// zero_grad, LR schedule step, progress print, global_steps += 1.
  void step();

  /// True when the next step() updates the weights.
  bool is_gradient_accumulation_boundary() const;
  /// Overrides the boundary for the next backward/step (DeepSpeed's
  /// set_gradient_accumulation_boundary); std::nullopt restores the managed rule.
  void set_gradient_accumulation_boundary(std::optional<bool> is_boundary);

  /// Sets every parameter's .grad to undefined (DeepSpeed's default: set to None).
  void zero_grad();
  /// Training / evaluation mode of the module. With hybrid_engine.enabled, eval() also prints
  /// DeepSpeed's latency line for the period since the previous eval() (generation, gather,
  /// training, others, samples/s), as DeepSpeed's hybrid engine does.
  void train(bool on = true);
  void eval();

  /// hybrid_engine.enabled (DeepSpeed's DeepSpeedHybridEngine.generate): runs `fn`, a
  /// generation with the model, and returns what it returns. Under ZeRO-3 with
  /// hybrid_engine.pin_parameters every partitioned parameter is gathered once for the whole
  /// generation (instead of around each layer's forward, token after token) and released
  /// after. `batch_size`: the samples this rank generates, for the samples/s figures (0: none).
  /// Every rank must call it (the gather is collective). UsageError without
  /// hybrid_engine.enabled.
  template <typename Fn>
  decltype(auto) generate_with(Fn&& fn, int64_t batch_size = 0) {
    GenerationScope scope(*this, batch_size);
    return std::forward<Fn>(fn)();
  }

  std::vector<double> get_lr() const;
  /// Unscaled, pre-clip global gradient L2 norm of the last optimizer step (nullopt before).
  std::optional<double> get_global_grad_norm() const { return global_grad_norm_; }
  int64_t global_steps() const { return global_steps_; }
  int64_t global_samples() const { return global_samples_; }
  int64_t micro_steps() const { return micro_steps_; }
  int64_t skipped_steps() const { return skipped_steps_; }
  /// The last optimizer step's training loss (averaged over its micro-steps, this rank).
  double last_loss() const;
  /// Tokens per sample, for tokens/s in the step log (0: not printed).
  void set_tokens_per_sample(int64_t tokens) { tokens_per_sample_ = tokens; }
  /// The lines printed every steps_per_print optimizer steps (DeepSpeed's `step=N, skipped=...`
  /// and `RunningAvgSamplesPerSec` lines and this port's readable line); on by default, as in
  /// DeepSpeed. A client that prints its own progress line (train_gpt) turns them off.
  void set_step_logging(bool enabled) { step_logging_ = enabled; }
  /// The current fp16 loss scale (1 without fp16 loss scaling).
  double loss_scale() const;
  /// The dtype the model trains in: fp32, or fp16/bf16 from the config.
  at::ScalarType model_dtype() const { return model_dtype_; }
  /// torch_autocast: the dtype each forward runs under autocast in (nullopt when the section
  /// is off). Its lower_precision_safe_modules' gradients are reduced in it too.
  std::optional<at::ScalarType> torch_autocast_dtype() const { return autocast_dtype_; }
  /// The device this rank trains on (DeepSpeed's engine.device): cuda:LOCAL_RANK in a CUDA build
  /// with a GPU visible (DS_ACCELERATOR=cpu keeps the CPU), else the CPU. The engine moves the
  /// model there; move each batch with `.to(engine.device())` as with DeepSpeed.
  at::Device device() const { return device_; }
  int global_rank() const { return comm::get_rank(); }
  int local_rank() const { return comm::get_local_rank(); }
  int world_size() const { return comm::get_world_size(); }
  int64_t dp_world_size() const { return config_.batch.dp_world_size; }
  /// The data-parallel group (the world without an mpu; with sequence_parallel_size > 1 the
  /// ranks that hold the same sequence chunk of different samples: feed them different
  /// samples), and the model-parallel group (this rank alone without an mpu).
  const comm::Group& data_parallel_group() const { return data_group_; }
  const comm::Group& model_parallel_group() const { return mp_group_; }
  int dp_rank() const { return data_group_.rank(); }
  /// The group gradients are reduced over and ZeRO partitions across: the data-parallel
  /// group, or with sequence parallelism data x sequence (DeepSpeed's seq_data_parallel_group).
  const comm::Group& seq_data_parallel_group() const { return dp_group_; }
  /// DeepSpeed-Ulysses (sequence_parallel_size > 1): this rank's group of consecutive ranks
  /// that share each sample, each holding 1/P of its tokens (deepspeed/sequence.h); this rank
  /// alone otherwise. DeepSpeed's engine.get_sequence_parallel_group().
  const comm::Group& sequence_parallel_group() const { return sp_group_; }
  int sequence_parallel_size() const { return sp_group_.size(); }
  int sequence_parallel_rank() const { return sp_group_.rank(); }
  int mp_rank() const { return mp_rank_; }
  /// The mpu given to initialize(), or nullptr.
  const std::shared_ptr<Mpu>& mpu() const { return mpu_; }
  int64_t train_batch_size() const { return config_.batch.train_batch_size; }
  int64_t train_micro_batch_size_per_gpu() const {
    return config_.batch.train_micro_batch_size_per_gpu;
  }
  int64_t gradient_accumulation_steps() const { return config_.batch.gradient_accumulation_steps; }
  int zero_optimization_stage() const { return static_cast<int>(config_.zero_optimization.stage); }
  double gradient_clipping() const { return config_.gradient_clipping; }
  const DeepSpeedConfig& config() const { return config_; }

  torch::nn::Module& module() { return *module_; }
  torch::optim::Optimizer* optimizer() { return optimizer_.get(); }
  optim::LRScheduler* lr_scheduler() { return lr_scheduler_.get(); }
  MemoryStats memory_stats() const;
  /// memory_stats() as one readable line (logged at initialization, after the first optimizer
  /// step, which creates the optimizer states, and on out-of-memory).
  std::string memory_report(const std::string& when = "on request") const;
  /// What the last backward's gradient reduction did (buckets, how many launched from hooks).
  runtime::ReductionStats reduction_stats() const;

  // Checkpoints (docs/checkpoints.md). Every rank must call these.
  /// DeepSpeed's save_checkpoint: "<save_dir>/<tag>/" with mp_rank_00_model_states.pt (rank 0:
  /// module, counters, scheduler, stage-0 optimizer, client_state, every rank's RNG state) and,
  /// under ZeRO 1/2, one [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt per rank (its fp32
  /// master partition, optimizer state and loss scaler). Files are written atomically and
  /// `latest` moves only after every rank finished. Default tag "global_step<N>". Throws
  /// UsageError for an empty save_dir, inside an unfinished accumulation boundary backward, or
  /// (checkpoint.tag_validation FAIL) for a tag that differs across ranks; CheckpointError on
  /// I/O failure (the previous checkpoint and `latest` stay as they were). Returns true.
  bool save_checkpoint(const std::string& save_dir,
                       const std::optional<std::string>& tag = std::nullopt,
                       const ClientState& client_state = {}, bool save_latest = true,
                       bool exclude_frozen_parameters = false);
  /// DeepSpeed's load_checkpoint. `tag` defaults to the content of "<load_dir>/latest" (when
  /// that file is missing: a warning and {nullopt, {}}, as DeepSpeed). Restores module, fp32
  /// masters and optimizer state (re-partitioned when the checkpoint was written by another
  /// number of ranks), scheduler, loss scaler, counters, RNG state; logs what it restored.
  /// Everything is read and checked before anything changes: on any error (missing tag
  /// directory or file, truncated or corrupt file, parameter names/shapes that differ, another
  /// ZeRO stage, a part the options ask for that the checkpoint lacks) every rank throws
  /// CheckpointError naming the file or part, and the engine is unchanged.
  LoadedCheckpoint load_checkpoint(const std::string& load_dir,
                                   const std::optional<std::string>& tag = std::nullopt,
                                   const LoadCheckpointOptions& options = {});
  /// checkpoint.writer.decoupled (Note [Decoupled checkpoints], docs/checkpoints.md): waits
  /// until every rank's files of the last save_checkpoint are durable, then moves `latest` to
  /// it. The engine commits on its own at the next optimizer step (as DeepSpeed), save_checkpoint
  /// and load_checkpoint; call this after the last save of a run (the destructor of a
  /// multi-rank engine finishes this rank's files but cannot move `latest`). Every rank must
  /// call it. Returns whether a checkpoint was pending. Throws CheckpointError on every rank
  /// when a rank's write failed, naming the file there; `latest` then stays where it was.
  bool commit_decoupled_checkpoint();
  /// DeepSpeed's save_16bit_model: the module's state dict in the training dtype, written by
  /// rank 0 as "<save_dir>/<save_filename>" (torch.save format; safetensors when the name ends
  /// in ".safetensors"). Tied parameters are stored once. Returns true.
  bool save_16bit_model(const std::string& save_dir,
                        const std::string& save_filename = "pytorch_model.bin",
                        bool exclude_frozen_parameters = false);
  /// Tied parameters: alias name -> name of the parameter holding the data (first occurrence).
  const std::vector<std::pair<std::string, std::string>>& shared_params() const {
    return shared_params_;
  }

  /// What the engine adds to this forward's keyword arguments (DeepSpeed's kwargs): set by
  /// each training forward (curriculum_learning's sequence length, progressive layer drop's
  /// theta), empty in evaluation. ModuleEngine passes it to a forward whose last parameter is
  /// `const ForwardKwargs&`; forward_with() callers read it here.
  const ForwardKwargs& forward_kwargs() const { return forward_kwargs_; }
  /// curriculum_learning's scheduler (DeepSpeed's curriculum_scheduler_legacy); nullptr when the
  /// section is off. Set a "custom" schedule's function on it before training.
  CurriculumScheduler* curriculum_scheduler_legacy() { return curriculum_.get(); }
  /// data_efficiency.data_routing.random_ltd's schedule (DeepSpeed's random_ltd_scheduler);
  /// nullptr when it is off.
  RandomLtdScheduler* random_ltd_scheduler() { return random_ltd_.get(); }
  /// compression_training's scheduler (DeepSpeed's compression_scheduler); nullptr when no
  /// technique is enabled.
  compression::CompressionScheduler* compression_scheduler() { return compression_.get(); }
  /// MoQ (weight quantization after each fp16 step); nullptr unless configured.
  compression::MoqQuantizer* moq_quantizer() { return moq_.get(); }
  /// progressive_layer_drop's current theta (DeepSpeed's get_pld_theta); nullopt when off.
  std::optional<double> get_pld_theta() const;

  /// Elapsed milliseconds of the named wall-clock timers over the last optimizer step
  /// (fwd, bwd, bwd_inner, bwd_allreduce, step), as logged with wall_clock_breakdown.
  std::vector<std::pair<std::string, double>> get_wall_clock_timers() const;
  /// DeepSpeed's RunningAvgSamplesPerSec: train_batch_size * timed optimizer steps / their time,
  /// counting each micro-step from forward to the end of step() and skipping the first 2
  /// optimizer steps (warm-up). nullopt before a step was timed or with
  /// timers.throughput.enabled false. See docs/observability.md.
  std::optional<double> running_avg_samples_per_sec() const;

 protected:
  void forward_begin();
  void forward_end();
  /// Matches DeepSpeed's autocast_if_enabled: with torch_autocast enabled, `scope` enters
  /// autocast in its dtype (replacing one the caller entered); when it is off but the caller
  /// entered autocast, `scope` turns it off, as the model then trains in the config's precision.
  void enter_autocast(std::optional<AutocastScope>& scope) const;
  /// Throws UsageError naming the feature when this forward has kwargs to pass but the model's
  /// forward (of `module_type`) takes no ForwardKwargs (DeepSpeed: an unexpected keyword
  /// argument).
  void check_forward_kwargs_taken(const char* module_type) const;
  /// The squared gradient norm over the model-parallel group from the data-parallel one
  /// (the pipeline engine sums the stages' norms instead: pipe.h).
  virtual double model_parallel_norm_squared(double dp_norm_squared) const;
  /// A pipeline keeps its weights in per-layer files (DeepSpeed's layout): its model-states
  /// files then hold 'module': None (checkpoint::ModelStates::module_in_layer_files).
  virtual bool module_in_layer_files() const { return false; }
  /// The module state of `model_file`, whose 'module' is None, from the layer files of
  /// `tag_dir`. Here: a CheckpointError naming the file (only a pipeline engine reads them).
  virtual checkpoint::TensorDict read_layer_files(const std::string& tag_dir,
                                                  const std::string& model_file) const;
  /// Whether this rank writes the checkpoint files that the data-parallel replicas of its
  /// model-parallel rank share (the model states, a pipeline stage's layer files): the first
  /// data-parallel rank, as DeepSpeed's save_non_zero_checkpoint, or with
  /// checkpoint.use_node_local_storage the first one on each node (Note [Node-local checkpoint
  /// storage]).
  bool writes_replicated_checkpoint_files() const;
  /// How this engine writes a checkpoint file: checkpoint.writer's way, queued when decoupled.
  checkpoint::FileSaver checkpoint_file_saver();
  /// A pipeline's micro-batch backward (run outside backward()) ended: where micro-steps are
  /// summed in fp32 (bf16, DeepSpeed's BF16_Optimizer) its gradients go there.
  void end_micro_batch_backward();
  /// `param`'s fp32 gradient sum over the micro-steps, which the boundary reduces; undefined
  /// where param.grad holds the sum.
  at::Tensor fp32_grad_sum(const at::Tensor& param);

 private:
  void set_parallel_groups();
  void set_sequence_parallel_groups();
  void check_sequence_parallel_combinations() const;
  void broadcast_parameters();
  void build_optimizer(std::unique_ptr<torch::optim::Optimizer> client,
                       std::vector<ParamGroup> model_parameters);
  void check_zero_optimizer();
  void check_offload_client_optimizer() const;  // zero_force_ds_cpu_optimizer
  /// Overflow vote, unscale + clip, optimizer; false when the step was skipped (overflow).
  bool take_model_step();
  at::ScalarType communication_dtype() const;
  void build_lr_scheduler(LRSchedulerFactory lr_scheduler);
  void report_out_of_memory(const std::string& during) const;
  /// Logs report_out_of_memory and throws OutOfMemoryError carrying `error` and the ledger.
  [[noreturn]] void throw_out_of_memory(const std::string& during, const std::string& error) const;
  /// Runs fn; an allocation failure (std::bad_alloc, or a c10::Error from an allocator) becomes
  /// an OutOfMemoryError with this rank's memory figures. Other errors pass through unchanged.
  template <typename Fn>
  auto with_memory_report(const std::string& during, Fn&& fn) -> decltype(fn()) {
    try {
      return fn();
    } catch (const std::bad_alloc& e) {
      throw_out_of_memory(during, e.what());
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      if (is_out_of_memory_message(msg)) throw_out_of_memory(during, msg);
      throw;
    }
  }
  static bool is_out_of_memory_message(const std::string& message);
  /// The constructor's work, run under with_memory_report("initialization").
  void setup(std::unique_ptr<torch::optim::Optimizer> optimizer, LRSchedulerFactory lr_scheduler,
             std::vector<ParamGroup> model_parameters);
  void report_progress();
  void print_progress();
  void log_throughput();
  void log_timers(bool boundary);
  // engine_checkpoint.cpp
  checkpoint::CheckpointWriter& checkpoint_writer();
  checkpoint::LossScalerState scaler_state() const;
  runtime::ZeroCheckpointContext checkpoint_context(const std::string& tag_dir) const;
  checkpoint::ModelStates model_states(const ClientState& client_state,
                                       bool exclude_frozen_parameters);
  void write_monitor_events();
  void write_timer_events();
  void finish_profile();

  std::shared_ptr<torch::nn::Module> module_;
  DeepSpeedConfig config_;
  std::shared_ptr<Mpu> mpu_;
  comm::Group dp_group_;    // gradients and ZeRO partitions (seq_data_parallel_group)
  comm::Group data_group_;  // data_parallel_group(): dp_group_ less the sequence ranks
  comm::Group sp_group_;    // sequence_parallel_group()
  comm::Group mp_group_;
  int mp_rank_ = 0;
  std::vector<at::Tensor> trainable_params_;  // each tensor once, in named_parameters order
  std::vector<std::string> trainable_names_;
  std::vector<std::pair<std::string, std::string>> shared_params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<optim::LRScheduler> lr_scheduler_;
  std::unique_ptr<runtime::ZeroOptimizer> zero_;
  std::unique_ptr<runtime::LossScaler> loss_scaler_;  // fp16 only
  // torch_autocast with fp16: torch's GradScaler (DeepSpeed keeps it out of checkpoints).
  std::unique_ptr<runtime::LossScaler> grad_scaler_;
  std::optional<at::ScalarType> autocast_dtype_;  // torch_autocast.enabled
  std::unique_ptr<monitor::MonitorMaster> monitor_;
  std::unique_ptr<profiling::FlopsProfiler> flops_profiler_;
  bool profiling_step_ = false;
  // Losses stay where backward() computed them (a GPU): reading one is a host synchronisation,
  // done when a log line, a monitor or last_loss() asks, not in every micro-step.
  at::Tensor interval_loss_;  // sum of backward()'s returns since the last boundary
  at::Tensor last_loss_;      // the last optimizer step's loss (mean over micro-steps)
  double interval_loss() const;
  int64_t tokens_per_sample_ = 0;
  bool step_logging_ = true;
  bool steady_state_reported_ = false;  // memory report after the first applied optimizer step
  at::ScalarType model_dtype_ = at::kFloat;
  at::Device device_ = at::kCPU;
  std::unique_ptr<runtime::Timers> timers_;
  std::unique_ptr<runtime::AutotuningProbe> autotuning_;
  std::unique_ptr<CurriculumScheduler> curriculum_;  // curriculum_learning.enabled
  std::unique_ptr<ProgressiveLayerDrop> pld_;        // progressive_layer_drop.enabled
  std::unique_ptr<RandomLtdScheduler> random_ltd_;   // data_efficiency...random_ltd.enabled
  std::unique_ptr<runtime::HybridEngineState> hybrid_;  // hybrid_engine.enabled
  std::unique_ptr<compression::CompressionScheduler> compression_;  // compression_training
  std::unique_ptr<compression::MoqQuantizer> moq_;  // its weight quantization after the step
  std::unique_ptr<checkpoint::CheckpointWriter> checkpoint_writer_;  // made at the first save
  /// A decoupled save_checkpoint whose `latest` has not moved yet.
  struct PendingCheckpoint {
    std::string save_dir;
    std::string tag;
    bool keeps_save_dir = false;  // this rank writes `latest` (commit_checkpoint's rank 0)
    bool save_latest = true;
  };
  std::optional<PendingCheckpoint> pending_checkpoint_;

  /// hybrid_engine.enabled: its state, and every rank's generator set to rank 0's (DeepSpeed
  /// synchronises them so that sampling draws the same tokens on every rank).
  void start_hybrid_engine();
  /// compression_training's scheduler and MoQ (engine_compression.cpp).
  void start_compression();

  /// generate_with()'s span: the hybrid engine's gather and timing, undone on any exit.
  class GenerationScope {
   public:
    GenerationScope(Engine& engine, int64_t batch_size);
    ~GenerationScope();
    GenerationScope(const GenerationScope&) = delete;
    GenerationScope& operator=(const GenerationScope&) = delete;

   private:
    Engine& engine_;
  };
  ForwardKwargs forward_kwargs_;  // autotuning.enabled (docs/autotuning.md)

  int64_t global_steps_ = 0;
  int64_t global_samples_ = 0;
  int64_t micro_steps_ = 0;
  int64_t skipped_steps_ = 0;
  std::optional<bool> boundary_override_;
  std::optional<double> global_grad_norm_;
  std::map<std::string, double> last_step_timers_;
  std::unique_ptr<runtime::ThroughputTimer> tput_timer_;
  std::chrono::steady_clock::time_point progress_start_;
  int64_t progress_samples_ = 0;
};

namespace detail {
template <typename M, typename Last, typename... Args>
auto forward_accepts(int)
    -> decltype(std::declval<M&>().forward(std::declval<Args>()..., std::declval<Last>()),
                std::true_type{});
template <typename M, typename Last, typename... Args>
std::false_type forward_accepts(...);
struct NotForwardKwargs {};
}  // namespace detail

/// Whether Module::forward(args..., const ForwardKwargs&) is callable and the parameter is
/// really ForwardKwargs: a forward that accepts any arguments (torch::nn::Sequential's variadic
/// template, which hands them to its first module) does not count.
template <typename Module, typename... Args>
inline constexpr bool kForwardTakesKwargs =
    decltype(detail::forward_accepts<Module, const ForwardKwargs&, Args...>(0))::value &&
    !decltype(detail::forward_accepts<Module, detail::NotForwardKwargs, Args...>(0))::value;

/// Engine for a concrete module type: forward(args...) calls the module's own forward.
template <typename Module>
class ModuleEngine : public Engine {
 public:
  ModuleEngine(std::shared_ptr<Module> module, DeepSpeedConfig config,
               std::unique_ptr<torch::optim::Optimizer> optimizer, LRSchedulerFactory lr_scheduler,
               std::vector<ParamGroup> model_parameters = {}, std::shared_ptr<Mpu> mpu = nullptr)
      : Engine(module, std::move(config), std::move(optimizer), std::move(lr_scheduler),
               std::move(model_parameters), std::move(mpu)),
        typed_module_(std::move(module)) {}

  /// Tensor arguments on another device are moved to device() (a CPU batch reaches the GPU);
  /// with fp16.auto_cast, floating-point ones are cast to the model's dtype.
  /// A forward whose last parameter is `const ForwardKwargs&` gets forward_kwargs() there.
  template <typename... Args>
  auto forward(Args&&... args) {
    return forward_with([&] {
      if constexpr (kForwardTakesKwargs<Module, Args...>) {
        return typed_module_->forward(auto_cast_input(std::forward<Args>(args))...,
                                      forward_kwargs());
      } else {
        check_forward_kwargs_taken(typeid(Module).name());
        return typed_module_->forward(auto_cast_input(std::forward<Args>(args))...);
      }
    });
  }
  template <typename T>
  decltype(auto) auto_cast_input(T&& arg) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
      at::Tensor t = arg.defined() && arg.device() != device()
                         ? arg.to(device(), /*non_blocking=*/true)
                         : at::Tensor(arg);
      return t.is_floating_point() && config().fp16.enabled && config().fp16.auto_cast
                 ? t.to(model_dtype())
                 : t;
    } else {
      return std::forward<T>(arg);
    }
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  /// hybrid_engine.enabled: the module's own generate(args...) through generate_with()
  /// (DeepSpeed's engine.generate); the first tensor argument's first dimension is the batch.
  template <typename... Args>
  decltype(auto) generate(Args&&... args) {
    int64_t batch = 0;
    auto take = [&batch](const auto& arg) {
      if constexpr (std::is_same_v<std::decay_t<decltype(arg)>, at::Tensor>) {
        if (batch == 0 && arg.defined() && arg.dim() > 0) batch = arg.size(0);
      }
    };
    (take(args), ...);
    return generate_with(
        [&]() -> decltype(auto) { return typed_module_->generate(std::forward<Args>(args)...); },
        batch);
  }

  Module& typed_module() { return *typed_module_; }

 private:
  std::shared_ptr<Module> typed_module_;
};

}  // namespace deepspeed

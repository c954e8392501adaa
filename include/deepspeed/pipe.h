// Pipeline parallelism (DeepSpeed's deepspeed.pipe): a model described as a list of layer specs,
// cut into stages, each stage built only on the ranks that own it; the 1F1B training schedule
// and the inference schedule as instruction streams; and PipelineEngine, which runs them with
// activations and gradients passed between stages by comm::send / recv. See docs/pipeline.md.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/engine.h"
#include "deepspeed/mpu.h"
#include "deepspeed/topology.h"

namespace deepspeed::pipe {

// ---------------------------------------------------------------------------------------------
// Layer specs

/// A built layer: the module holding its parameters (null for a parameter-free function) and
/// its forward on the activation coming from the previous layer.
struct Layer {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(const at::Tensor&)> forward;
  /// Optional: the layer's auxiliary loss from the forward just run (an MoE layer's
  /// load-balancing loss: a scalar connected to its parameters), called right after each
  /// forward. The training loss is loss_fn's plus PipelineModuleOptions::aux_loss_coef times the
  /// sum of every stage's layers' auxiliary losses; each stage back-propagates its own share, so
  /// nothing but the activation travels between stages.
  std::function<at::Tensor()> aux_loss;
};

/// DeepSpeed's LayerSpec: how to build one layer, called only on the stage that owns it (and,
/// for partition_method "parameters", once on every rank to count its parameters).
/// `type_name` is what partition_method "type:<regex>" matches (DeepSpeed: the class name).
/// A TiedLayerSpec (below) sets `tied_key`: every spec with that key shares one module per
/// stage, whose `tied_weight_attr` parameters are kept equal across the stages that hold it.
struct LayerSpec {
  std::string type_name;
  std::function<Layer()> build;
  std::string tied_key;                    // empty: not tied
  std::vector<std::string> tied_weight_attr;  // e.g. {"weight"}; dotted paths allowed
  /// Tied layers: forward through the shared module (DeepSpeed's forward_fn); null = the
  /// forward of the layer that built the module.
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> tied_forward;

  /// A spec for a module type with a forward(Tensor): `LayerSpec::of<torch::nn::Linear>("Linear",
  /// torch::nn::LinearOptions(8, 8))`.
  template <typename Holder, typename... Args>
  static LayerSpec of(std::string type_name, Args... args) {
    LayerSpec s;
    s.type_name = std::move(type_name);
    s.build = [args...]() {
      Holder h(args...);
      auto impl = h.ptr();
      return Layer{impl, [impl](const at::Tensor& x) { return impl->forward(x); }, {}};
    };
    return s;
  }
  /// A parameter-free layer (DeepSpeed accepts any callable in the layer list).
  static LayerSpec function(std::string type_name, std::function<at::Tensor(const at::Tensor&)> fn);
};

/// DeepSpeed's TiedLayerSpec: `spec` built once per stage under `key`; `forward_fn` (may be
/// null) runs the shared module differently at this position (an output head reusing the
/// embedding's weight).
LayerSpec TiedLayerSpec(std::string key, LayerSpec spec,
                        std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward_fn =
                            nullptr,
                        std::vector<std::string> tied_weight_attr = {"weight"});

// ---------------------------------------------------------------------------------------------
// Partitioning (DeepSpeed's runtime/utils.py; parts[s]..parts[s+1] are stage s's layers)

/// DeepSpeed's partition_uniform: num_items split into num_parts runs, the first
/// (num_items % num_parts) one longer; with fewer items than parts, one item per part.
std::vector<int> partition_uniform(int num_items, int num_parts);
/// DeepSpeed's partition_balanced: contiguous runs minimizing the spread between the heaviest
/// and lightest run (its dynamic program, ties to the later cut).
std::vector<int> partition_balanced(const std::vector<double>& weights, int num_parts);
/// DeepSpeed's PipelineModule._partition_layers for `method` ("uniform", "parameters",
/// "type:<regex>", case-insensitive): the stage bounds of `specs`. "parameters" builds each
/// layer once to count its trainable parameters. Throws ConfigError for another method, a regex
/// matching no layer, or more stages than layers.
std::vector<int> partition_layers(const std::vector<LayerSpec>& specs, const std::string& method,
                                  int num_stages);
/// The lines DeepSpeed's PipelineModule prints on rank 0 about its partition: the method, then
/// per stage "stage=S layers=N" and each layer's index and type name.
std::vector<std::string> describe_partition(const std::vector<LayerSpec>& specs,
                                            const std::vector<int>& parts,
                                            const std::string& method);

// ---------------------------------------------------------------------------------------------
// PipelineModule

using LossFn = std::function<at::Tensor(const at::Tensor& outputs, const at::Tensor& labels)>;

struct PipelineModuleOptions {
  /// Pipeline stages; must divide the world size (data-parallel size = world / num_stages).
  /// 0: take the topology's pipe axis.
  int num_stages = 0;
  /// Axes pipe and data (DeepSpeed's PipeDataParallelTopology); default: num_stages x the rest.
  std::optional<ProcessTopology> topology;
  /// loss = loss_fn(outputs of the last layer, labels), on the last stage.
  LossFn loss_fn;
  /// Seed the RNG with base_seed + layer index before building each layer (DeepSpeed's
  /// seed_layers): the same weights whatever the partition.
  bool seed_layers = false;
  int64_t base_seed = 1234;
  std::string partition_method = "parameters";
  /// DeepSpeed's activation_checkpoint_interval: every that many layers form one activation
  /// checkpoint (deepspeed/checkpointing.h); 0 disables. See docs/pipeline.md.
  int activation_checkpoint_interval = 0;
  /// The weight of the layers' auxiliary losses (Layer::aux_loss) in the training loss.
  double aux_loss_coef = 1.0;
};

/// DeepSpeed's PipelineModule: the layers of this rank's stage (registered as "<layer index>",
/// tied modules as "tied_modules.<key>"), the stage bounds of every stage, the tied-weight
/// groups, and the process groups of the topology. Collective over the world (it makes the
/// topology's and the tied layers' groups). Throws ConfigError when num_stages does not divide
/// the world or exceeds the number of layers.
class PipelineModule : public torch::nn::Module {
 public:
  PipelineModule(std::vector<LayerSpec> layers, PipelineModuleOptions options);

  /// Runs this stage's layers on `input` (the micro-batch on the first stage, the previous
  /// stage's activation otherwise).
  /// With activation_checkpoint_interval > 0, every run of that many layers holding parameters
  /// goes through checkpointing::checkpoint (recomputed in backward); the auxiliary losses of
  /// its layers leave the checkpoint as a second output.
  at::Tensor forward(const at::Tensor& input);
  /// Whether a layer of this stage has an auxiliary loss (Layer::aux_loss).
  bool has_aux_loss() const;
  /// The sum of this stage's layers' auxiliary losses in the last forward (unweighted, with
  /// grad); undefined when no layer of the stage has one.
  const at::Tensor& aux_loss() const { return aux_loss_; }
  /// The engine sets the config's pipeline.activation_checkpoint_interval here when the module
  /// was built without one.
  void set_activation_checkpoint_interval(int interval);

  int num_stages() const { return num_stages_; }
  int stage_id() const { return stage_id_; }
  bool is_first_stage() const { return stage_id_ == 0; }
  bool is_last_stage() const { return stage_id_ == num_stages_ - 1; }
  /// parts[s] .. parts[s + 1] - 1 are stage s's layer indices.
  const std::vector<int>& partitions() const { return parts_; }
  int stage_owner(int layer_idx) const;
  int local_start() const { return parts_[stage_id_]; }
  int local_stop() const { return parts_[stage_id_ + 1]; }
  int num_layers() const { return static_cast<int>(specs_.size()); }
  const LossFn& loss_fn() const { return options_.loss_fn; }
  const PipelineModuleOptions& options() const { return options_; }
  const ProcessTopology& topology() const { return mpu_->topology(); }
  /// The mpu the engine is given: data group = this stage's data-parallel replicas, model
  /// group = every stage of this replica (the overflow vote and the norm span the pipeline).
  std::shared_ptr<Mpu> mpu() const { return engine_mpu_; }
  const comm::ParallelGroups& groups() const { return mpu_->groups(); }

  /// The module whose state is local layer `layer_idx`'s (global index) in a checkpoint
  /// (DeepSpeed saves each layer's state_dict): its own module, the shared module for a tied
  /// layer without a forward_fn, or null (a function, a tied layer with a forward_fn, another
  /// stage's layer).
  std::shared_ptr<torch::nn::Module> layer_module(int layer_idx) const;
  /// The tied modules this stage holds whose state another stage's layer file keeps (the layer
  /// of the key's first spec without a forward_fn, as DeepSpeed saves it): {that layer's
  /// index, the module}. A node-local checkpoint writes them on this stage's node too.
  std::vector<std::pair<int, std::shared_ptr<torch::nn::Module>>> tied_layers_elsewhere() const;

  /// DeepSpeed's allreduce_tied_weight_gradients: sums the tied weights' gradients over the
  /// stages sharing them (same data-parallel index). `grad_of(w)`, when given, names the
  /// tensor holding w's gradient (the engine's fp32 sum, as DeepSpeed's _hp_grad); where it
  /// returns an undefined tensor, w.grad().
  void allreduce_tied_weight_gradients(
      const std::function<at::Tensor(const at::Tensor&)>& grad_of = {});
  /// The tied parameters this rank holds but another stage counts in the gradient norm
  /// (DeepSpeed's ds_pipe_replicated).
  std::vector<at::Tensor> replicated_tied_parameters() const;
  /// Broadcasts each tied weight from the first stage holding it (DeepSpeed's
  /// _synchronize_tied_weights): every copy starts equal.
  void synchronize_tied_weights();

 private:
  struct TiedComm {
    std::string key;
    std::vector<int> ranks;
    comm::Group group;
    std::shared_ptr<torch::nn::Module> module;
  };
  void build_local_layers();
  void index_tied_modules();
  /// Local layers [begin, end) in order; adds their auxiliary losses to `*aux`.
  at::Tensor run_layers(size_t begin, size_t end, const at::Tensor& input, at::Tensor* aux);
  static at::Tensor tied_weight(torch::nn::Module& m, const std::string& attr);

  std::vector<LayerSpec> specs_;
  PipelineModuleOptions options_;
  std::shared_ptr<TopologyMpu> mpu_;
  std::shared_ptr<Mpu> engine_mpu_;
  int num_stages_ = 1;
  int stage_id_ = 0;
  std::vector<int> parts_;
  std::vector<std::function<at::Tensor(const at::Tensor&)>> forward_funcs_;
  std::vector<std::shared_ptr<torch::nn::Module>> local_modules_;  // per local layer (may be null)
  std::vector<bool> local_has_parameters_;  // per local layer, tied functions included
  std::vector<std::function<at::Tensor()>> local_aux_losses_;  // per local layer (may be null)
  at::Tensor aux_loss_;  // the last forward's sum of local_aux_losses_
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> tied_modules_;
  std::vector<std::pair<std::string, std::function<at::Tensor(const at::Tensor&)>>> tied_forwards_;
  std::vector<TiedComm> tied_comms_;
};

// ---------------------------------------------------------------------------------------------
// Schedules (DeepSpeed's runtime/pipe/schedule.py)

/// One pipeline instruction. `buffer_id` is the pipe buffer it works on (-1 for the
/// batch-level ones).
struct Instruction {
  enum class Kind {
    kLoadMicroBatch,
    kForwardPass,
    kBackwardPass,
    kSendActivation,
    kRecvActivation,
    kSendGrad,
    kRecvGrad,
    kReduceTiedGrads,
    kReduceGrads,
    kOptimizerStep,
  };
  Kind kind;
  int buffer_id = -1;

  bool operator==(const Instruction& o) const { return kind == o.kind && buffer_id == o.buffer_id; }
  /// DeepSpeed's repr: "LoadMicroBatch(buffer_id=0)", "ReduceGrads()".
  std::string str() const;
};

/// The instructions of one stage, one list per schedule step (each step is atomic: a barrier
/// could be placed between steps without deadlock).
using ScheduleSteps = std::vector<std::vector<Instruction>>;

/// DeepSpeed's TrainSchedule: synchronous 1F1B over 2 * (micro_batches + stages - 1) steps,
/// ending with ReduceTiedGrads, ReduceGrads, OptimizerStep.
ScheduleSteps train_schedule(int micro_batches, int stages, int stage_id);
/// DeepSpeed's TrainSchedule.num_pipe_buffers: max(2, min(stages - stage_id, micro_batches)).
int train_schedule_num_buffers(int micro_batches, int stages, int stage_id);
/// DeepSpeed's InferenceSchedule: forward only over micro_batches + stages - 1 steps, two
/// buffers alternating between receive and send.
ScheduleSteps inference_schedule(int micro_batches, int stages, int stage_id);

// ---------------------------------------------------------------------------------------------
// PipelineEngine

/// One micro-batch: `first` feeds the first stage, `second` (the labels) the last stage's loss.
using MicroBatch = std::pair<at::Tensor, at::Tensor>;
/// DeepSpeed's data_iter: called once per micro-batch on the first and the last stage only.
using DataIterator = std::function<MicroBatch()>;

/// Where a stage's time went in the last train_batch / eval_batch, in milliseconds
/// (wall_clock_breakdown logs it; the bench derives the bubble from it).
struct PipeStageTimes {
  double batch_ms = 0.0;      // the whole batch, schedule start to optimizer step done
  double forward_ms = 0.0;    // ForwardPass (with the loss on the last stage)
  double backward_ms = 0.0;   // BackwardPass
  double recv_wait_ms = 0.0;  // RecvActivation / RecvGrad: waiting for the neighbour
  double send_ms = 0.0;       // SendActivation / SendGrad, and waiting for them at the end
  double reduce_ms = 0.0;     // ReduceTiedGrads + ReduceGrads
  double step_ms = 0.0;       // OptimizerStep
  /// 1 - (forward + backward) / batch: the share of the batch this stage did not compute.
  double idle_fraction() const;
};

/// DeepSpeed's PipelineEngine: train_batch() runs TrainSchedule over
/// gradient_accumulation_steps micro-batches, eval_batch() the InferenceSchedule. The stage's
/// parameters are trained by the ordinary Engine (ZeRO stage 0 or 1, fp32 / bf16 / fp16,
/// clipping, LR schedule, checkpoints); the data-parallel group is the stage's replicas and
/// the norm, the overflow vote and the loss span the whole pipeline. Construction is
/// collective over the world. Throws NotSupportedError for ZeRO stage 2 or 3 (named as
/// DeepSpeed does) and ConfigError for a `pipeline` section that contradicts the module.
class PipelineEngine : public Engine {
 public:
  PipelineEngine(std::shared_ptr<PipelineModule> module, DeepSpeedConfig config,
                 std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                 LRSchedulerFactory lr_scheduler = nullptr);

  /// One optimizer step over gradient_accumulation_steps micro-batches drawn from `data_iter`
  /// (first and last stage). Returns the mean loss over the micro-batches (averaged over the
  /// data-parallel replicas) on every stage, as DeepSpeed's train_batch. Every rank of the job
  /// must call it. Throws UsageError when a micro-batch's activation shape differs from the
  /// one negotiated with the next stage on the first micro-batch.
  at::Tensor train_batch(const DataIterator& data_iter);
  /// Forward only (no gradients) over gradient_accumulation_steps micro-batches; returns the
  /// mean loss on every stage (DeepSpeed's eval_batch with reduce_output="avg").
  at::Tensor eval_batch(const DataIterator& data_iter);

  /// DeepSpeed's pipeline checkpoint layout in "<save_dir>/<tag>/": one
  /// "layer_XX-model_states.pt" per layer with state (the layer's state dict, written by the
  /// stage's data-parallel rank 0, or split among the replicas with
  /// checkpoint.parallel_write.pipeline_stage), then the base engine's files, whose
  /// model-parallel rank is the stage: "mp_rank_<stage>_model_states.pt" (this stage's module,
  /// counters, scheduler, optimizer) and, under ZeRO-1, one optimizer file per data-parallel
  /// rank and stage.
  /// Collective over the world; `latest` moves only when every rank finished.
  bool save_checkpoint(const std::string& save_dir,
                       const std::optional<std::string>& tag = std::nullopt,
                       const ClientState& client_state = {});
  /// Same number of stages: the base engine's exact resume (weights, optimizer, scheduler,
  /// counters, RNG). Another number of stages: the weights of this stage's layers from the
  /// layer files (the tied weights then broadcast from their first stage); needs
  /// options.load_module_only (optimizer states are per stage) and ZeRO stage 0 in fp32.
  /// Throws CheckpointError naming the file or the mismatch.
  LoadedCheckpoint load_checkpoint(const std::string& load_dir,
                                   const std::optional<std::string>& tag = std::nullopt,
                                   const LoadCheckpointOptions& options = {});

  PipelineModule& pipeline_module() { return *pipe_module_; }
  int stage_id() const { return pipe_module_->stage_id(); }
  int num_stages() const { return pipe_module_->num_stages(); }
  bool is_first_stage() const { return pipe_module_->is_first_stage(); }
  bool is_last_stage() const { return pipe_module_->is_last_stage(); }
  int64_t micro_batches() const { return gradient_accumulation_steps(); }
  /// The loss train_batch returned last (DeepSpeed's agg_train_loss): loss_fn's mean plus
  /// aux_loss_coef times agg_aux_loss().
  double agg_train_loss() const { return agg_train_loss_; }
  /// The layers' auxiliary losses (Layer::aux_loss) in the last train_batch, unweighted: summed
  /// over the stages, averaged over the micro-batches and the data-parallel replicas (0 without
  /// any).
  double agg_aux_loss() const { return agg_aux_loss_; }
  const PipeStageTimes& last_batch_times() const { return times_; }

 protected:
  double model_parallel_norm_squared(double dp_norm_squared) const override;
  bool module_in_layer_files() const override { return true; }
  checkpoint::TensorDict read_layer_files(const std::string& tag_dir,
                                          const std::string& model_file) const override;

 private:
  /// The stage's layers [first, last) whose files this rank writes (layers_to_write's
  /// comment in pipeline_checkpoint.cpp says who writes what).
  std::pair<int, int> layers_to_write() const;

  struct Buffer {
    at::Tensor inputs;   // the loaded micro-batch or the received activation
    at::Tensor labels;   // last stage
    at::Tensor outputs;  // the activation sent on, or the loss on the last stage
    at::Tensor grad;     // the received gradient of `outputs`
    at::Tensor aux;      // training: this stage's auxiliary losses of the micro-batch
  };
  struct PendingSend {
    comm::Handle handle;
    at::Tensor tensor;  // kept alive until the send completed
  };
  /// curriculum_learning: the difficulty of the coming batch, and a new shape negotiation when
  /// it changed (DeepSpeed's reset_activation_shape).
  void advance_curriculum();
  void execute(const Instruction& ins, const DataIterator& data_iter, bool training);
  void load_micro_batch(Buffer& b, const DataIterator& data_iter);
  void forward_pass(Buffer& b, bool training);
  void backward_pass(Buffer& b);
  void send_activation(Buffer& b);
  void recv_activation(Buffer& b);
  void send_grad(Buffer& b);
  void recv_grad(Buffer& b);
  void reduce_tied_grads();
  void reduce_grads();
  void wait_sends();
  at::Tensor aggregate_loss(int micro_batches, bool training);
  at::Tensor aggregate_loss_with_aux(int micro_batches, bool training);
  int prev_rank() const;
  int next_rank() const;

  std::shared_ptr<PipelineModule> pipe_module_;
  comm::Group pipe_group_;
  std::vector<Buffer> buffers_;
  std::vector<PendingSend> pending_sends_;
  std::vector<at::Tensor> losses_;  // last stage: each micro-batch's loss, detached
  std::vector<at::Tensor> aux_losses_;  // each micro-batch's auxiliary losses, detached
  bool pipeline_has_aux_loss_ = false;  // a layer of some stage has an auxiliary loss
  // Note [Activation shapes]: the first activation a stage sends is preceded by its shape and
  // dtype; later ones must match (DeepSpeed negotiates once unless dynamic_shape).
  std::optional<std::vector<int64_t>> sent_shape_;
  std::optional<std::vector<int64_t>> recv_shape_;
  at::ScalarType recv_dtype_ = at::kFloat;
  double replicated_tied_norm_sq_ = 0.0;
  double agg_train_loss_ = 0.0;
  double agg_aux_loss_ = 0.0;
  PipeStageTimes times_;
};

/// DeepSpeed's initialize() for a PipelineModule: parses `config` for the module's
/// data-parallel size (world / stages) and builds the PipelineEngine.
std::shared_ptr<PipelineEngine> initialize(std::shared_ptr<PipelineModule> module,
                                           const DeepSpeedConfig& config,
                                           std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                                           LRSchedulerFactory lr_scheduler = nullptr);
std::shared_ptr<PipelineEngine> initialize(std::shared_ptr<PipelineModule> module,
                                           const json& config,
                                           std::unique_ptr<torch::optim::Optimizer> optimizer = nullptr,
                                           LRSchedulerFactory lr_scheduler = nullptr);

}  // namespace deepspeed::pipe

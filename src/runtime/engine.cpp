// Engine: orchestrates a training step (see engine.h). The pieces live elsewhere: gradient
// reduction in grad_reducer, clipping in grad_clip, optimizer/scheduler construction in optim/.
#include "deepspeed/engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <iomanip>
#include <sstream>
#include <typeinfo>

#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Type.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include "config/auto_sizes.h"
#include "deepspeed/comms_logging.h"
#include "deepspeed/curriculum_scheduler.h"
#include "deepspeed/dynamic_batching_config.h"
#include "deepspeed/monitor.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"
#include "deepspeed/pipe.h"
#include "deepspeed/compression.h"
#include "deepspeed/progressive_layer_drop.h"
#include "deepspeed/profiler.h"
#include "deepspeed/random_ltd.h"
#include "deepspeed/zero3.h"
#include "runtime/accelerator/accelerator.h"
#include "runtime/accelerator/module_placement.h"
#include "runtime/autotuning_probe.h"
#include "runtime/checkpoint/checkpoint_writer.h"
#include "runtime/data_efficiency/variable_batch_lr.h"
#include "runtime/grad_clip.h"
#include "runtime/host_caching_allocator.h"
#include "runtime/hybrid/hybrid_engine_state.h"
#include "runtime/memory_budget.h"
#include "runtime/memory_formula.h"
#include "runtime/auto_ep_setup.h"
#include "runtime/moe_params.h"
#include "runtime/muon_combinations.h"
#include "runtime/optim/optimizer_factory.h"
#include "runtime/pipe/pipe_engine_mpu.h"
#include "runtime/precision/autocast_params.h"
#include "runtime/precision/cpu_bf16_matmul.h"
#include "runtime/precision/grad_scaler.h"
#include "runtime/precision/loss_scaler.h"
#include "runtime/precision/overflow_check.h"
#include "runtime/sparse_grad.h"
#include "runtime/tensor_parallel/engine_autotp.h"
#include "runtime/timers.h"
#include "runtime/zero/master_weights.h"
#include "runtime/zero/zero_optimizer.h"
#include "util/check.h"
#include "util/env.h"
#include "util/logging.h"
#include "util/memory.h"

namespace deepspeed {
namespace {

const std::vector<std::string> kMicroTimers = {"fwd_microstep", "bwd_microstep",
                                               "bwd_inner_microstep", "bwd_allreduce_microstep",
                                               "step_microstep"};
const std::vector<std::string> kGlobalTimers = {"fwd", "bwd", "bwd_inner", "bwd_allreduce",
                                                "step"};

// Waits for the device of `params` (nothing on CPU), so that host clocks time finished work.
std::function<void()> device_synchronizer(const std::vector<at::Tensor>& params) {
  if (params.empty() || params.front().device().is_cpu()) return {};
  const at::Device device = params.front().device();
  return [device] {
    c10::impl::getDeviceGuardImpl(device.type())->getStream(device).synchronize();
  };
}

// DeepSpeed's accelerator memory figures: the CUDA caching allocator's on a GPU; on CPU its
// accelerator reports the resident set as allocated and as cached memory.
runtime::TimerMemoryUsage memory_usage(const at::Device& device) {
  if (device.is_cuda()) {
    const auto d = runtime::device_memory(device);
    return {d.allocated_bytes, d.max_allocated_bytes, d.reserved_bytes, d.max_reserved_bytes};
  }
  const auto m = util::read_process_memory();
  return {m.rss_bytes, m.peak_rss_bytes, m.rss_bytes, m.peak_rss_bytes};
}

std::string format_list(const std::vector<double>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

std::vector<double> momentum_of(torch::optim::Optimizer& opt) {
  std::vector<double> out;
  for (auto& group : opt.param_groups()) {
    auto& o = group.options();
    if (auto* d = dynamic_cast<optim::GroupOptions*>(&o)) {
      if (d->has("betas")) out.push_back(d->pair("betas").first);
      else if (d->has("momentum")) out.push_back(d->number("momentum"));
    } else if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) {
      out.push_back(std::get<0>(a->betas()));
    } else if (auto* b = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      out.push_back(std::get<0>(b->betas()));
    }
  }
  return out;
}

// Without a skipping overflow check (fp32; bf16 with check_grad_overflow false) a non-finite
// gradient norm goes into the optimizer as DeepSpeed lets it, but not silently. The norm is the
// same on every rank; rank 0 says so, and each rank whose own loss was non-finite names itself.
std::string number_text(double v) {
  if (std::isnan(v)) return "nan";  // never "-nan": the sign of a nan means nothing
  std::ostringstream os;
  os << v;
  return os.str();
}

void warn_non_finite_grad_norm(double norm, int64_t step, double rank_loss) {
  const int rank = comm::get_rank();
  if (rank != 0 && std::isfinite(rank_loss)) return;
  std::ostringstream os;
  os << "[rank " << rank << "/" << comm::get_world_size() << "] step " << step
     << ": the global gradient norm is " << number_text(norm)
     << " (this rank's loss: " << number_text(rank_loss) << "); with no overflow check (fp32, or bf16 with check_grad_overflow false) the "
        "optimizer applies these gradients and the parameters become non-finite. Lower the "
        "learning rate, set gradient_clipping, or train in bf16 with check_grad_overflow to skip "
        "such steps";
  log::warn(os.str());
}

// Matches DeepSpeed: at ZeRO stage 0 only a bf16 pipeline (BF16_Optimizer) reads the key; the
// config warns for the other stages (ds_config.cpp).
void warn_if_immediate_grad_update_idle(const DeepSpeedConfig& config, bool pipeline) {
  if (!config.bf16.enabled || !config.bf16.immediate_grad_update) return;
  if (config.zero_optimization.stage != 0 || pipeline) return;
  log::warn_rank0(config.source + ": bf16.immediate_grad_update has no effect at "
                  "zero_optimization.stage 0 outside a pipeline (as in DeepSpeed, whose bf16 "
                  "wrapper there sums the micro-steps in param.grad)");
}

// Matches DeepSpeed, where only PipelineModule's layer files are split among the replicas;
// elsewhere data-parallel rank 0 writes the model states whatever the key says.
void warn_if_parallel_write_idle(const DeepSpeedConfig& config, bool pipeline) {
  if (!config.checkpoint.parallel_write_pipeline_stage || pipeline) return;
  log::warn_rank0(config.source + ": checkpoint.parallel_write.pipeline_stage has no effect "
                  "outside a pipeline (as in DeepSpeed, which splits only a pipeline stage's "
                  "layer files among its replicas)");
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> module, DeepSpeedConfig config,
               std::unique_ptr<torch::optim::Optimizer> optimizer,
               LRSchedulerFactory lr_scheduler, std::vector<ParamGroup> model_parameters,
               std::shared_ptr<Mpu> mpu)
    : module_(std::move(module)), config_(std::move(config)), mpu_(std::move(mpu)),
      timers_(std::make_unique<runtime::Timers>()) {
  runtime::apply_memory_budget_from_env();  // before the engine allocates anything
  with_memory_report("initialization", [&] {
    setup(std::move(optimizer), std::move(lr_scheduler), std::move(model_parameters));
  });
}

void Engine::setup(std::unique_ptr<torch::optim::Optimizer> optimizer,
                   LRSchedulerFactory lr_scheduler, std::vector<ParamGroup> model_parameters) {
  DS_CHECK(module_ != nullptr, UsageError, "deepspeed::initialize requires a model");
  comm::init_distributed();
  comm::PhaseScope phase(comm::Phase::kInit);
  set_parallel_groups();
  if (sp_group_.size() > 1) check_sequence_parallel_combinations();
  // tensor_parallel.autotp_size without an mpu: DeepSpeed's groups of consecutive ranks.
  if (auto tp_mpu = runtime::autotp_mpu(config_, mpu_); tp_mpu != mpu_) {
    mpu_ = std::move(tp_mpu);
    set_parallel_groups();
  }
  // See runtime/host_caching_allocator.h: large CPU activations are reused, not re-faulted.
  if (env::get_int("DS_HOST_CACHING_ALLOCATOR").value_or(1) != 0) {
    runtime::install_host_caching_allocator();
  }
  const int world = comm::get_world_size();
  DS_CHECK(config_.batch.dp_world_size == data_group_.size(), ConfigError, config_.source,
           ": the batch triad was resolved for ", config_.batch.dp_world_size,
           " data-parallel ranks but this job has ", data_group_.size(),
           mpu_ ? " (the mpu's data-parallel size)"
                : std::string(" (WORLD_SIZE=") + std::to_string(world) +
                      (sp_group_.size() > 1 ? " / sequence_parallel_size" : "") + ")",
           "; load the config after init_distributed() with the job's data-parallel size "
           "(deepspeed::load_config(config, mpu) with an mpu)");
  config_.check_supported();
  for (const auto& w : config_.warnings) log::warn_rank0(w);
  if (config_.seed) torch::manual_seed(static_cast<uint64_t>(*config_.seed));
  if (mpu_) runtime::apply_autotp(config_, *module_, *mpu_);  // before anything sees the shapes

  // C++ modules list a tied parameter under each name that registers it (Python dedups): the
  // engine reduces and steps each tensor once and remembers the aliases for checkpoints.
  std::map<const void*, std::string> first_name;
  for (auto& item : module_->named_parameters()) {
    auto [it, inserted] = first_name.emplace(item.value().unsafeGetTensorImpl(), item.key());
    if (!inserted) {
      shared_params_.emplace_back(item.key(), it->second);
      continue;
    }
    if (item.value().requires_grad()) {
      trainable_params_.push_back(item.value());
      trainable_names_.push_back(item.key());
    }
  }
  // zero_optimization sizes given as "auto" come from the model's shapes (config/auto_sizes.h).
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& p : trainable_params_) shapes.push_back(p.sizes().vec());
  config_detail::resolve_auto_sizes_from_model(config_, shapes);
  for (const auto& n : config_.notes) log::info_rank0(n);
  // Matches DeepSpeed: fp16/bf16 training casts the module; the optimizer steps fp32 masters.
  if (config_.fp16.enabled) {
    model_dtype_ = at::kHalf;
  } else if (config_.bf16.enabled) {
    model_dtype_ = at::kBFloat16;
  }
  if (model_dtype_ != at::kFloat) module_->to(model_dtype_);
  // Matches DeepSpeed: the engine moves the module to its accelerator device (cuda:LOCAL_RANK);
  // ZeRO's partitions, flat buffers and buckets then follow the parameters' device.
  device_ = runtime::training_device(comm::get_local_rank());
  runtime::CommDtypes comm_dtypes;  // torch_autocast's lower-precision parameters
  if (config_.torch_autocast.enabled) {
    autocast_dtype_ = runtime::torch_autocast_dtype(config_, device_.type());
    std::vector<std::string> unmatched;
    comm_dtypes = runtime::autocast_comm_dtypes(*module_, config_, *autocast_dtype_, &unmatched);
    for (const auto& name : unmatched) {
      log::warn_rank0(config_.source + ": torch_autocast.lower_precision_safe_modules: \"" +
                      name + "\" names no module of the model");
    }
    if (config_.communication_data_type) {
      log::warn_rank0(config_.source + ": communication_data_type is not used with "
                      "torch_autocast: as in DeepSpeed, each gradient is reduced in its own "
                      "dtype, those of the lower_precision_safe_modules in torch_autocast.dtype");
    }
    std::ostringstream note;
    note << "torch_autocast: forward under " << *autocast_dtype_ << " autocast; "
         << comm_dtypes.size() << " parameters communicated in " << *autocast_dtype_;
    log::info_rank0(note.str());
  }
  // bf16 training, or bf16 autocast, on a CPU where LibTorch 1.x sums bf16 products in bf16.
  if ((model_dtype_ == at::kBFloat16 || autocast_dtype_ == at::kBFloat16) && device_.is_cpu()) {
    const std::string note = runtime::use_fp32_accumulating_bf16_matmul_where_needed();
    if (!note.empty()) log::info_rank0(note);
  }
  const bool stage3 = config_.zero_optimization.stage == 3;
  const bool model_parallel = mpu_ != nullptr || runtime::autotp_size(config_) > 1;
  // Under ZeRO-3 AutoEP shards its experts first: zero::Init (below, on a GPU) then leaves
  // them whole, and the stage cuts them for their expert-data-parallel group (Note [Expert
  // partitions] in stage3_param.h).
  if (stage3) runtime::configure_auto_ep(*module_, config_, dp_group_, model_parallel);
  if (!device_.is_cpu()) {
    runtime::set_current_device(device_);
    // ZeRO-3 partitions the parameters where they are, in host memory, before the move, as
    // zero::Init would have at construction: the device then never holds the whole model, only
    // this rank's shards and what a gather brings. (Without an optimizer the model stays whole.)
    if (stage3 && (optimizer || config_.optimizer.present)) {
      zero::Init partitioned(config_, mpu_);
      partitioned.partition(*module_);
    }
    runtime::move_module_to_device(*module_, device_);
    log::info_rank0("engine: training on " + device_.str());
  }
  // MoE layers get their expert groups (collectively) before the parameters are broadcast.
  runtime::configure_moe_layers(*module_, config_, dp_group_,
                                mpu_ ? mpu_->get_pipe_parallel_world_size() : 1);
  // AutoEP shards its layers' experts before the broadcast, which then starts them from their
  // expert-data-parallel group's first rank.
  if (!stage3) runtime::configure_auto_ep(*module_, config_, dp_group_, model_parallel);
  // ZeRO-3 broadcasts while it partitions, one parameter at a time (never the whole model).
  if (!stage3) broadcast_parameters();
  // The ZeRO stage re-points the optimizer's param groups, so the optimizer is built over the
  // model's parameters first and the scheduler after the stage exists.
  build_optimizer(std::move(optimizer), std::move(model_parameters));
  DS_CHECK(sp_group_.size() == 1 ||
               dynamic_cast<onebit::CompressedCommunication*>(optimizer_.get()) == nullptr,
           NotSupportedError, config_.source, ": sequence_parallel_size (", sp_group_.size(),
           ") with a 1-bit optimizer is not supported yet (its compressed all-reduce averages "
           "over every rank)");
  if (stage3 && !optimizer_) broadcast_parameters();
  if (optimizer_) {
    check_zero_optimizer();
    runtime::ZeroContext ctx;
    ctx.config = &config_;
    ctx.optimizer = optimizer_.get();
    ctx.trainable_params = trainable_params_;
    ctx.param_names = trainable_names_;
    ctx.model_dtype = model_dtype_;
    ctx.communication_dtype = communication_dtype();
    // data_types.grad_accum_dtype; unset: fp32 (more accurate than DeepSpeed's default of the
    // model dtype, at 2 extra bytes per owned element).
    const auto& gad = config_.data_types.grad_accum_dtype;
    ctx.grad_accum_dtype = gad == "fp16" ? at::kHalf : gad == "bf16" ? at::kBFloat16 : at::kFloat;
    ctx.master_dtype = runtime::configure_master_weights(config_, *optimizer_);
    ctx.module = module_;
    ctx.dp_group = dp_group_;
    // Matches DeepSpeed under sequence parallelism: summed over each sequence's ranks,
    // averaged over the data-parallel ones.
    if (sp_group_.size() > 1) ctx.average_divisor = data_group_.size();
    ctx.expert_params = runtime::moe_expert_params(*module_);
    ctx.comm_dtypes = std::move(comm_dtypes);
    ctx.mics = runtime::make_mics_groups(config_, dp_group_, mpu_ != nullptr);
    ctx.hpz_group = runtime::make_hpz_group(config_, dp_group_, mpu_ != nullptr);
    ctx.qgz_groups = runtime::make_qgz_groups(config_, dp_group_, mpu_ != nullptr);
    ctx.pipeline = dynamic_cast<const pipe::PipelineModule*>(module_.get()) != nullptr;
    runtime::MuonSetting muon;
    // A pipeline's mpu spans its stages as the "model-parallel" group; its tensor-parallel
    // group is the topology's model axis.
    int mpu_tp = mpu_ ? mpu_->get_model_parallel_world_size() : 1;
    if (const auto* p = dynamic_cast<const pipe::PipeEngineMpu*>(mpu_.get())) {
      mpu_tp = p->tensor_group().size();
    }
    muon.model_parallel_size = std::max(mpu_tp, runtime::autotp_size(config_));
    runtime::check_muon_combinations(*optimizer_, config_, muon);
    warn_if_immediate_grad_update_idle(config_, ctx.pipeline);
    warn_if_parallel_write_idle(config_, ctx.pipeline);
    if (config_.sparse_gradients) {
      // Matches DeepSpeed: embedding gradients go as rows without ZeRO; its ZeRO optimizers
      // reduce every gradient densely, whatever the key says.
      const auto names = runtime::sparse_gradient_names(*module_);
      if (config_.zero_optimization.stage == 0) {
        for (const auto& p : module_->named_parameters()) {
          if (std::find(names.begin(), names.end(), p.key()) != names.end()) {
            ctx.sparse_gradients.insert(p.value().unsafeGetTensorImpl());
          }
        }
      } else {
        log::warn_rank0(config_.source + ": sparse_gradients has no effect under "
                        "zero_optimization.stage " +
                        std::to_string(config_.zero_optimization.stage) +
                        ": as in DeepSpeed, the ZeRO optimizers reduce every gradient densely");
      }
      log::info_rank0("sparse_gradients: " + std::to_string(ctx.sparse_gradients.size()) +
                      " embedding weight(s) reduced as rows");
    }
    zero_ = config_.zero_optimization.stage == 0 ? runtime::make_stage0(ctx)
            : stage3                             ? runtime::make_stage3(ctx)
                                                 : runtime::make_stage1_2(ctx);
    runtime::exclude_replicated_from_norm(*zero_, trainable_params_);
    build_lr_scheduler(std::move(lr_scheduler));
    if (config_.fp16.enabled) {
      // Matches DeepSpeed: ZeRO's scaler keeps hysteresis; the non-ZeRO FP16_Optimizer's does not.
      loss_scaler_ = runtime::make_loss_scaler(
          config_.fp16, config_.zero_optimization.stage == 0 ? runtime::LossScalerFlavor::kFp16Optimizer
                                                             : runtime::LossScalerFlavor::kZero);
    }
    // Matches DeepSpeed: fp16 autocast scales the loss with torch's GradScaler.
    if (autocast_dtype_ == at::kHalf) grad_scaler_ = std::make_unique<runtime::TorchGradScaler>();
  }
  // Matches DeepSpeed: the flops profiler turns the wall-clock breakdown on.
  if (config_.flops_profiler.enabled) config_.wall_clock_breakdown = true;
  monitor_ = std::make_unique<monitor::MonitorMaster>(config_);
  comm::configure_comms_logger(config_.comms_logger);
  if (config_.flops_profiler.enabled) {
    flops_profiler_ = std::make_unique<profiling::FlopsProfiler>(module_, config_.flops_profiler);
  }
  if (config_.dump_state) log::info_rank0("config: " + config_.resolved().dump(2));
  if (config_.progressive_layer_drop.enabled) {
    pld_ = std::make_unique<ProgressiveLayerDrop>(config_.progressive_layer_drop.theta,
                                                  config_.progressive_layer_drop.gamma);
    std::ostringstream pld;
    pld << "Enabled progressive layer dropping (theta = " << config_.progressive_layer_drop.theta
        << ")";
    log::info_rank0(pld.str());
  }
  if (config_.curriculum_learning.enabled) {
    curriculum_ = std::make_unique<CurriculumScheduler>(config_.curriculum_learning);
  }
  if (config_.hybrid_engine.enabled) start_hybrid_engine();
  if (config_.data_efficiency.random_ltd.enabled) {
    random_ltd_ = std::make_unique<RandomLtdScheduler>(config_.data_efficiency.random_ltd,
                                                       config_.batch.train_batch_size);
  }
  start_compression();
  std::ostringstream os;
  os << "engine ready: world_size=" << world << " zero_stage=" << config_.zero_optimization.stage
     << " train_batch_size=" << config_.batch.train_batch_size
     << " micro_batch=" << config_.batch.train_micro_batch_size_per_gpu
     << " grad_accum=" << config_.batch.gradient_accumulation_steps
     << " trainable_params=" << trainable_params_.size()
     << " buckets=" << (zero_ ? zero_->num_buckets() : 0);
  log::info_rank0(os.str());
  if (zero_) log::info_rank0(memory_report("after initialization"));
  // Matches DeepSpeed: the wall-clock timers are synchronized (they time device events), the
  // throughput timer when timers.throughput.synchronized.
  if (config_.wall_clock_breakdown) {
    timers_->set_synchronize(device_synchronizer(trainable_params_));
  }
  runtime::ThroughputTimerOptions tput;
  tput.enabled = config_.timers_throughput.enabled;
  tput.batch_size = config_.batch.train_batch_size;
  tput.steps_per_output = config_.steps_per_print;
  tput_timer_ = std::make_unique<runtime::ThroughputTimer>(
      tput, runtime::steady_clock_seconds,
      config_.timers_throughput.synchronized ? device_synchronizer(trainable_params_)
                                             : std::function<void()>());
  progress_start_ = std::chrono::steady_clock::now();
  if (AutotuningConfig::of(config_).enabled) {
    runtime::AutotuningModelFacts facts;
    for (const auto& p : module_->parameters()) {
      facts.num_params += p.numel();
      facts.largest_param_numel = std::max<int64_t>(facts.largest_param_numel, p.numel());
    }
    for (const auto& p : trainable_params_) facts.trainable_num_params += p.numel();
    facts.param_bytes = c10::elementSize(model_dtype_);
    facts.dp_world_size = config_.batch.dp_world_size;
    facts.mp_world_size = mpu_ ? mpu_->get_model_parallel_world_size() : 1;
    facts.on_cpu = device_.is_cpu();
    autotuning_ = std::make_unique<runtime::AutotuningProbe>(config_, facts, comm::get_rank());
  }
}

Engine::~Engine() {
  if (!pending_checkpoint_) return;
  // Note [Decoupled checkpoints]: alone, the commit needs no other rank; otherwise the files
  // are finished but `latest` cannot move without the other ranks.
  const std::string tag_dir =
      checkpoint::tag_directory(pending_checkpoint_->save_dir, pending_checkpoint_->tag);
  try {
    if (!comm::is_initialized() || comm::get_world_size() == 1) {
      commit_decoupled_checkpoint();
      return;
    }
    checkpoint_writer_->wait();
    log::warn("the decoupled checkpoint " + tag_dir + " was written but not committed: `latest` "
              "still names the previous checkpoint; call commit_decoupled_checkpoint() on every "
              "rank after the last save_checkpoint");
  } catch (const std::exception& e) {
    log::warn("the decoupled checkpoint " + tag_dir + " failed: " + e.what());
  }
}

void Engine::set_parallel_groups() {
  const int64_t sp = config_.sequence_parallel_size;
  sp_group_ = comm::self_group("sequence");
  if (!mpu_) {
    dp_group_ = comm::world();
    data_group_ = dp_group_;
    mp_group_ = comm::self_group("model");
    if (sp > 1) set_sequence_parallel_groups();
    return;
  }
  DS_CHECK(sp == 1, UsageError, config_.source, ": sequence_parallel_size (", sp,
           ") with an mpu is not supported: the engine builds the sequence-parallel groups "
           "itself from the config (leave the mpu out)");
  dp_group_ = mpu_->get_data_parallel_group();
  data_group_ = dp_group_;
  mp_group_ = mpu_->get_model_parallel_group();
  for (const comm::Group* g : {&dp_group_, &mp_group_}) {
    DS_CHECK(g->is_member(), UsageError, "deepspeed::initialize: the mpu's ",
             g == &dp_group_ ? "data" : "model", "-parallel group ", g->describe(),
             " does not hold this rank (", comm::get_rank(),
             "); its get_*_parallel_group() must return the group this rank belongs to");
  }
  DS_CHECK(dp_group_.size() * mp_group_.size() <= comm::get_world_size(), UsageError,
           "deepspeed::initialize: the mpu's data-parallel size (", dp_group_.size(),
           ") times its model-parallel size (", mp_group_.size(), ") exceeds the world size (",
           comm::get_world_size(), ")");
  mp_rank_ = mp_group_.rank();
}

void Engine::set_sequence_parallel_groups() {
  // Matches DeepSpeed-Ulysses' groups (parallel_state_sp.py): consecutive ranks share a
  // sequence; gradients are reduced and ZeRO partitions over every rank.
  const int world = comm::get_world_size();
  const int64_t sp = config_.sequence_parallel_size;
  DS_CHECK(world % sp == 0, ConfigError, config_.source, ": sequence_parallel_size (", sp,
           ") does not divide the world size (", world, ")");
  DS_CHECK(!config_.data_parallel_size || *config_.data_parallel_size * sp == world,
           ConfigError, config_.source, ": data_parallel_size (",
           config_.data_parallel_size.value_or(0), ") times sequence_parallel_size (", sp,
           ") must equal the world size (", world, ")");
  comm::ParallelGroups groups(
      ProcessTopology({"data", "sequence"}, {static_cast<int>(world / sp), static_cast<int>(sp)}));
  data_group_ = groups.data();
  sp_group_ = groups.group("sequence");
}

void Engine::check_sequence_parallel_combinations() const {
  const int64_t sp = config_.sequence_parallel_size;
  DS_CHECK(runtime::autotp_size(config_) <= 1, NotSupportedError, config_.source,
           ": sequence_parallel_size (", sp, ") with tensor_parallel.autotp_size is not "
           "supported yet");
  DS_CHECK(runtime::moe_expert_params(*module_).empty(), NotSupportedError, config_.source,
           ": sequence_parallel_size (", sp, ") with MoE layers is not supported yet");
}

void Engine::broadcast_parameters() {
  // Matches DeepSpeed: every data-parallel rank starts from its group's first rank's
  // parameters; MoE expert parameters from their expert-data-parallel group's first rank.
  runtime::broadcast_module_parameters(*module_, dp_group_);
}

void Engine::build_optimizer(std::unique_ptr<torch::optim::Optimizer> client,
                             std::vector<ParamGroup> model_parameters) {
  if (client) {
    optimizer_ = std::move(client);
    check_offload_client_optimizer();
  } else if (config_.optimizer.present) {
    if (model_parameters.empty()) model_parameters.push_back(ParamGroup{trainable_params_, json::object()});
    optim::OptimizerBuildOptions options;
    options.offload = config_.zero_optimization.optimizer_offload() != OffloadDevice::kNone;
    for (size_t i = 0; i < trainable_params_.size(); ++i) {
      options.param_names[trainable_params_[i].unsafeGetTensorImpl()] = trainable_names_[i];
    }
    optimizer_ = optim::build_optimizer(config_.optimizer, model_parameters, config_.source,
                                        options);
  }
  // Without an optimizer backward()/step() refuse later, as DeepSpeed's DummyOptim does.
}

void Engine::check_offload_client_optimizer() const {
  if (config_.zero_optimization.optimizer_offload() == OffloadDevice::kNone ||
      !config_.zero_force_ds_cpu_optimizer) {
    return;
  }
  // Matches DeepSpeed (zero_force_ds_cpu_optimizer): with offload a client optimizer must be
  // DeepSpeedCPUAdam / DeepSpeedCPULion, here deepspeed::optim::Adam / Lion (CPU-Adam kernel).
  const auto* o = optimizer_.get();
  if (dynamic_cast<const optim::Adam*>(o) || dynamic_cast<const optim::Lion*>(o)) return;
  const auto* ds = dynamic_cast<const optim::DsOptimizer*>(o);
  const std::string type = ds ? ds->type_name() : c10::demangle(typeid(*o).name());
  DS_CHECK(false, ConfigError, config_.source,
           ": You are using ZeRO-Offload with a client provided optimizer (", type,
           ") which in most cases will yield poor performance. Please either use "
           "deepspeed::optim::Adam (DeepSpeedCPUAdam) or set an optimizer in your ds_config. If "
           "you really want to use a custom optimizer w. ZeRO-Offload and understand the "
           "performance impacts you can also set <\"zero_force_ds_cpu_optimizer\": false> in "
           "your configuration file.");
}

void Engine::check_zero_optimizer() {
  if (config_.zero_optimization.stage == 0 || config_.zero_allow_untested_optimizer) return;
  // Matches DeepSpeed (zero/utils.py): ZeRO is tested with Adam-family, Adagrad and Lion.
  const bool tested = optim::is_zero_supported_optimizer(*optimizer_);
  DS_CHECK(tested, ConfigError, config_.source,
           ": You are using an untested ZeRO Optimizer. Please add "
           "<\"zero_allow_untested_optimizer\": true> in the configuration file to use it.");
}

void Engine::build_lr_scheduler(LRSchedulerFactory lr_scheduler) {
  if (lr_scheduler) {
    lr_scheduler_ = lr_scheduler(*optimizer_);
  } else if (data_sampling::dynamic_batching_config(config_).enabled) {
    // The rate scaled per batch once make_variable_batch_loader knows the batches.
    lr_scheduler_ = data_sampling::make_variable_batch_lr_scheduler(*this, *optimizer_);
  } else if (config_.scheduler.present) {
    lr_scheduler_ = optim::make_lr_scheduler(config_.scheduler, *optimizer_, config_.source);
  }
}

void Engine::forward_begin() {
  comm::set_phase(comm::Phase::kForward);
  // Matches DeepSpeed's forward: training forwards get progressive layer drop's state, for a
  // "seqlen" curriculum the sequence length of global step global_steps + 1, and random-LTD's
  // schedule moved to global step global_steps.
  forward_kwargs_ = ForwardKwargs{};
  if (module_->is_training()) {
    if (pld_) {
      forward_kwargs_.progressive_layer_drop = true;
      forward_kwargs_.pld_theta = pld_->get_theta();
    }
    if (curriculum_) {
      const int64_t difficulty = curriculum_->update_difficulty(global_steps_ + 1);
      if (curriculum_->config().curriculum_type == "seqlen") {
        forward_kwargs_.curriculum_seqlen = difficulty;
      }
    }
    if (random_ltd_) {
      random_ltd_->update_seq(global_steps_);
      forward_kwargs_.random_ltd = random_ltd_.get();
    }
  }
  // Matches DeepSpeed: before the first step each forward switches on what starts at step 0
  // (and MoQ quantizes then).
  if (compression_ && global_steps_ == 0) compression_->step(/*step_zero_check=*/true);
  if (moq_ && global_steps_ == 0 && compression_->weight_quantization_enabled()) {
    at::NoGradGuard no_grad;
    moq_->quantize(/*overflow=*/false);
  }
  if (autotuning_) autotuning_->forward_begin();
  // Matches DeepSpeed: the profiler records the forward of global step profile_step on rank 0.
  if (flops_profiler_ && comm::get_rank() == 0 &&
      global_steps_ == config_.flops_profiler.profile_step && !flops_profiler_->started()) {
    flops_profiler_->start_profile();
    profiling_step_ = true;
  }
  // Matches DeepSpeed: without its own data loader the throughput timer starts in forward.
  tput_timer_->start();
  timers_->start("fwd_microstep");
  timers_->start("fwd");
}

std::optional<double> Engine::get_pld_theta() const {
  if (!pld_) return std::nullopt;
  return pld_->get_theta();
}

void Engine::check_forward_kwargs_taken(const char* module_type) const {
  if (forward_kwargs_.empty()) return;
  const std::string feature =
      forward_kwargs_.curriculum_seqlen
          ? "curriculum_learning (curriculum_type \"seqlen\") passes curriculum_seqlen"
      : forward_kwargs_.progressive_layer_drop
          ? "progressive_layer_drop passes progressive_layer_drop and pld_theta"
          : "data_efficiency.data_routing.random_ltd passes its schedule (random_ltd)";
  DS_CHECK(false, UsageError, feature, " to the model's training forward, but ",
           c10::demangle(module_type),
           "::forward takes no `const deepspeed::ForwardKwargs&` as its last parameter; add one "
           "(or read engine.forward_kwargs() through forward_with)");
}

void Engine::forward_end() {
  timers_->stop("fwd");
  timers_->stop("fwd_microstep");
  if (profiling_step_ && flops_profiler_->started()) flops_profiler_->stop_profile();
  if (autotuning_) autotuning_->forward_end();
}

bool Engine::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  if (!config_.managed_gradient_accumulation) return true;
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

void Engine::end_micro_batch_backward() { zero_->end_micro_batch_backward(); }

at::Tensor Engine::fp32_grad_sum(const at::Tensor& param) { return zero_->fp32_grad_sum(param); }

void Engine::set_gradient_accumulation_boundary(std::optional<bool> is_boundary) {
  boundary_override_ = is_boundary;
}

at::Tensor Engine::backward(const at::Tensor& loss) {
  DS_CHECK(optimizer_ != nullptr, UsageError,
           "engine.backward(): the engine has no optimizer; give one in the config's "
           "\"optimizer\" section or to deepspeed::initialize()");
  DS_CHECK(loss.defined() && loss.numel() == 1, UsageError,
           "engine.backward(): the loss must be a scalar tensor, got shape ",
           loss.defined() ? loss.sizes() : at::IntArrayRef{});
  DS_CHECK(loss.requires_grad(), UsageError,
           "engine.backward(): the loss does not require grad (was it computed under "
           "NoGradGuard, or from a model in eval with frozen parameters?)");
  comm::PhaseScope phase(comm::Phase::kBackward);
  timers_->start("bwd_microstep");
  timers_->start("bwd");
  const bool boundary = is_gradient_accumulation_boundary();
  zero_->begin_backward(boundary);
  // Matches DeepSpeed: gradients are averaged over the accumulation steps (reference §5.2).
  const int64_t gas = config_.managed_gradient_accumulation
                          ? config_.batch.gradient_accumulation_steps
                          : 1;
  at::Tensor scaled = gas > 1 ? loss / static_cast<double>(gas) : loss;
  // fp16: the loss is scaled so that small gradients survive in half precision.
  if (loss_scaler_ || grad_scaler_) scaled = scaled * loss_scale();
  timers_->start("bwd_inner_microstep");
  timers_->start("bwd_inner");
  with_memory_report("backward", [&] { scaled.backward(); });
  timers_->stop("bwd_inner");
  timers_->stop("bwd_inner_microstep");
  timers_->start("bwd_allreduce_microstep");
  timers_->start("bwd_allreduce");
  with_memory_report("gradient reduction", [&] { zero_->end_backward(boundary); });
  if (autotuning_) autotuning_->backward_end();
  timers_->stop("bwd_allreduce");
  timers_->stop("bwd_allreduce_microstep");
  timers_->stop("bwd");
  timers_->stop("bwd_microstep");
  at::Tensor result =
      loss_scaler_ || grad_scaler_ ? (scaled / loss_scale()).detach() : scaled.detach();
  const at::Tensor micro_loss = result.to(at::kDouble).reshape({});
  interval_loss_ = interval_loss_.defined() ? interval_loss_ + micro_loss : micro_loss;
  return result;
}

void Engine::step() {
  DS_CHECK(optimizer_ != nullptr, UsageError,
           "engine.step(): the engine has no optimizer; give one in the config's \"optimizer\" "
           "section or to deepspeed::initialize()");
  DS_CHECK(!zero_->backward_pending(), UsageError,
           "engine.step(): the last backward on the accumulation boundary did not finish");
  comm::PhaseScope phase(comm::Phase::kStep);
  timers_->start("step_microstep");
  const bool boundary = is_gradient_accumulation_boundary();
  bool progress = false;  // a steps_per_print boundary
  if (boundary) {
    // Matches DeepSpeed: a decoupled checkpoint is committed before the model step.
    if (pending_checkpoint_) commit_decoupled_checkpoint();
    timers_->start("step");
    // Matches DeepSpeed: theta follows the global step before this optimizer step.
    if (pld_) pld_->update_state(global_steps_);
    torch::NoGradGuard no_grad;
    bool applied = false;
    with_memory_report("optimizer step", [&] { applied = take_model_step(); });
    // Matches DeepSpeed: MoQ quantizes the updated 16-bit weights (not after an overflow).
    if (moq_ && compression_->weight_quantization_enabled()) moq_->quantize(!applied);
    zero_grad();
    // Matches DeepSpeed: the schedules advance after the optimizer, never on skipped steps.
    if (compression_ && applied) compression_->step();
    if (lr_scheduler_ && applied) lr_scheduler_->step();
    progress = step_logging_ && config_.steps_per_print &&
               (global_steps_ + 1) % *config_.steps_per_print == 0;
    if (progress) report_progress();
    // The optimizer creates its states at its first update (Note [Lazy optimizer state]): the
    // report at initialization cannot show them, this one does.
    if (applied && zero_ && !steady_state_reported_) {
      steady_state_reported_ = true;
      log::info_rank0(memory_report("after the first optimizer step (steady state)"));
    }
    global_steps_ += 1;
    global_samples_ += config_.batch.train_batch_size;
  }
  // Matches DeepSpeed: the throughput timer ends every micro-step after the model step.
  if (tput_timer_->stop(boundary) && step_logging_) log_throughput();
  if (boundary) {
    if (progress) print_progress();
    timers_->stop("step");
    write_monitor_events();
  }
  timers_->stop("step_microstep");
  if (config_.wall_clock_breakdown) log_timers(boundary);
  for (const auto& t : kMicroTimers) timers_->reset(t);
  if (boundary) {
    for (const auto& t : kGlobalTimers) last_step_timers_[t] = timers_->elapsed_ms(t);
    finish_profile();
    write_timer_events();
    for (const auto& t : kGlobalTimers) timers_->reset(t);
  }
  micro_steps_ += 1;
  boundary_override_.reset();
  comm::set_phase(comm::Phase::kOther);
  if (hybrid_) hybrid_->on_step();  // DeepSpeed's hybrid engine times every step() call
  // May end the process once the profile steps are measured (Note [Autotuning exit]).
  if (boundary && autotuning_) {
    autotuning_->after_step(global_steps_, last_step_timers_, memory_stats().device_bytes());
  }
}

bool Engine::take_model_step() {
  // Overflow: fp16 always, bf16 with check_grad_overflow (reference §2.4); one vote over the
  // data-parallel group, then (as DeepSpeed's ZeRO optimizers) over the model-parallel group.
  const bool check = model_dtype_ == at::kHalf || grad_scaler_ ||
                     (model_dtype_ == at::kBFloat16 && config_.bf16.check_grad_overflow);
  if (check) {
    bool overflow = runtime::any_rank_overflow(zero_->local_overflow(), dp_group_);
    if (mp_group_.size() > 1) overflow = runtime::any_rank_overflow(overflow, mp_group_);
    // A pipeline's model-parallel group is its stages; its tensor-parallel ranks vote too.
    if (auto tp = runtime::tensor_parallel_group_of(trainable_params_);
        tp && tp->size() > 1 && tp->impl() != mp_group_.impl()) {
      overflow = runtime::any_rank_overflow(overflow, *tp);
    }
    if (overflow) {
      const double before = loss_scale();
      // The dynamic scaler logs DeepSpeed's "OVERFLOW! ..." line itself.
      if (loss_scaler_) {
        loss_scaler_->update_scale(true);
      } else if (grad_scaler_) {
        log::info_rank0("OVERFLOW! inf/nan in the gradients (torch_autocast fp16); skipping "
                        "step, GradScaler scale " + std::to_string(grad_scaler_->loss_scale()));
        grad_scaler_->update_scale(true);
      } else {
        log::info_rank0("OVERFLOW! inf/nan in the bf16 gradients (bf16.check_grad_overflow); "
                        "skipping step");
      }
      zero_->loss_scale_updated(true, loss_scale() / before);
      skipped_steps_ += 1;
      global_grad_norm_.reset();
      return false;
    }
  }
  const double used_scale = loss_scale();
  zero_->before_grad_norm(used_scale);
  const double norm = std::sqrt(model_parallel_norm_squared(zero_->grad_norm_squared())) / used_scale;
  global_grad_norm_ = norm;
  if (!std::isfinite(norm)) warn_non_finite_grad_norm(norm, global_steps_ + 1, interval_loss());
  // Matches DeepSpeed (reference §2.5): the scale is updated before unscaling, and unscaling
  // and clipping are one multiply by 1/combined.
  if (loss_scaler_) loss_scaler_->update_scale(false);
  if (loss_scale() != used_scale) zero_->loss_scale_updated(false, loss_scale() / used_scale);
  // GradScaler unscales by the scale the loss was multiplied with, and updates after the step.
  const double combined = runtime::combined_scale(
      norm * used_scale, grad_scaler_ ? used_scale : loss_scale(), config_.gradient_clipping);
  if (combined != 1.0) zero_->scale_gradients(1.0 / combined);
  zero_->optimizer_step();
  if (grad_scaler_) {
    grad_scaler_->update_scale(false);
    if (loss_scale() != used_scale) zero_->loss_scale_updated(false, loss_scale() / used_scale);
  }
  return true;
}

double Engine::model_parallel_norm_squared(double dp_norm_squared) const {
  if (mp_group_.size() == 1) return dp_norm_squared;
  // Matches DeepSpeed's get_grad_norm_direct: a parameter that is not split across the
  // model-parallel ranks counts on model-parallel rank 0 only, then the squares are summed over
  // the model-parallel group. With tensor-parallel parameters the ZeRO stage already left the
  // replicated ones out on the other ranks (exclude_replicated_from_norm); without, every
  // parameter is replicated and this is model-parallel rank 0's norm on every rank.
  const bool split = runtime::tensor_parallel_group_of(trainable_params_).has_value();
  at::Tensor t = at::full({1}, split || mp_group_.rank() == 0 ? dp_norm_squared : 0.0,
                          at::TensorOptions().dtype(at::kDouble));
  comm::all_reduce(t, comm::ReduceOp::kSum, false, mp_group_);
  return t.item<double>();
}

double Engine::interval_loss() const {
  return interval_loss_.defined() ? interval_loss_.item<double>() : 0.0;
}

double Engine::last_loss() const { return last_loss_.defined() ? last_loss_.item<double>() : 0.0; }

double Engine::loss_scale() const {
  if (loss_scaler_) return loss_scaler_->loss_scale();
  return grad_scaler_ ? grad_scaler_->loss_scale() : 1.0;
}

void Engine::enter_autocast(std::optional<AutocastScope>& scope) const {
  // Matches DeepSpeed's autocast_if_enabled, including its one-time messages.
  static std::atomic<bool> warned{false};
  const c10::DeviceType type = device_.type();
  const bool outside = autocast_enabled(type);
  if (autocast_dtype_) {
    if (outside && !warned.exchange(true)) {
      log::info_rank0("torch.autocast is already enabled outside DeepSpeed. Switching to the "
                      "configuration defined in `torch_autocast` section of DeepSpeed config.");
    }
    scope.emplace(type, *autocast_dtype_, /*enabled=*/true);
  } else if (outside) {
    if (!warned.exchange(true)) {
      log::warn_rank0(
          "torch.autocast is enabled outside DeepSpeed but disabled within the DeepSpeed engine. "
          "If you are using DeepSpeed's built-in mixed precision, the engine will follow the "
          "settings in bf16/fp16 section. To use torch's native autocast instead, configure the "
          "`torch_autocast` section in the DeepSpeed config.");
    }
    scope.emplace(type, autocast_dtype(type), /*enabled=*/false);
  }
}

at::ScalarType Engine::communication_dtype() const {
  // Matches DeepSpeed's ZeRO under torch_autocast: each parameter in its own dtype (fp32), the
  // lower-precision modules' in the autocast dtype (ZeroContext::comm_dtypes).
  if (config_.torch_autocast.enabled) return model_dtype_;
  // Matches DeepSpeed: sequence parallelism replaces communication_data_type with
  // seq_parallel_communication_data_type (fp32 unless set).
  if (sp_group_.size() > 1) {
    const auto& t = config_.seq_parallel_communication_data_type;
    return t == "fp16" ? at::kHalf : t == "bf16" ? at::kBFloat16 : at::kFloat;
  }
  // Matches DeepSpeed's engine: the configured type, else the model's training dtype.
  if (config_.communication_data_type) {
    const auto& t = *config_.communication_data_type;
    if (t == "fp16") return at::kHalf;
    if (t == "bf16") return at::kBFloat16;
    return at::kFloat;
  }
  return model_dtype_;
}

void Engine::write_monitor_events() {
  last_loss_ = interval_loss_;
  interval_loss_ = at::Tensor();
  if (!monitor_->enabled()) return;
  // Matches DeepSpeed: the loss at the samples before this step, lr (and scale) after it.
  std::vector<monitor::Event> events{
      {monitor::kTrainLoss, last_loss(), global_samples_ - config_.batch.train_batch_size},
      {monitor::kLr, get_lr().empty() ? 0.0 : get_lr()[0], global_samples_}};
  if (loss_scaler_) events.push_back({monitor::kLossScale, loss_scale(), global_samples_});
  monitor_->write_events(events);
}

void Engine::write_timer_events() {
  if (!monitor_->enabled() || !(config_.wall_clock_breakdown || flops_profiler_)) return;
  monitor_->write_events({{monitor::kElapsedForward, last_step_timers_["fwd"], global_samples_},
                          {monitor::kElapsedBackward, last_step_timers_["bwd"], global_samples_},
                          {monitor::kElapsedBackwardInner, last_step_timers_["bwd_inner"],
                           global_samples_},
                          {monitor::kElapsedBackwardAllreduce, last_step_timers_["bwd_allreduce"],
                           global_samples_},
                          {monitor::kElapsedStep, last_step_timers_["step"], global_samples_}});
}

void Engine::finish_profile() {
  if (!profiling_step_) return;
  profiling_step_ = false;
  profiling::ProfileContext ctx;
  ctx.world_size = comm::get_world_size();
  ctx.dp_world_size = config_.batch.dp_world_size;
  ctx.train_micro_batch_size_per_gpu = config_.batch.train_micro_batch_size_per_gpu;
  if (config_.wall_clock_breakdown) {
    ctx.fwd_latency_s = last_step_timers_["fwd"] / 1e3;
    ctx.bwd_latency_s = last_step_timers_["bwd"] / 1e3;
    ctx.step_latency_s = last_step_timers_["step"] / 1e3;
  }
  if (autotuning_) autotuning_->set_forward_flops(flops_profiler_->get_total_flops());
  flops_profiler_->print_model_profile(global_steps_ - 1, ctx);
  flops_profiler_->end_profile();
}

void Engine::zero_grad() {
  if (zero_) zero_->zero_grad();
  for (auto& p : module_->parameters()) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

std::vector<double> Engine::get_lr() const {
  std::vector<double> out;
  if (!optimizer_) return out;
  for (auto& g : optimizer_->param_groups()) out.push_back(g.options().get_lr());
  return out;
}

MemoryStats Engine::memory_stats() const {
  auto m = util::read_process_memory();
  MemoryStats s;
  s.rss_bytes = m.rss_bytes;
  s.peak_rss_bytes = m.peak_rss_bytes;
  s.host_cached_bytes = runtime::host_cache_stats().cached_bytes;
  const auto dm = runtime::device_memory(device_);
  s.device_allocated_bytes = dm.allocated_bytes;
  s.device_max_allocated_bytes = dm.max_allocated_bytes;
  s.device_reserved_bytes = dm.reserved_bytes;
  s.device_max_reserved_bytes = dm.max_reserved_bytes;
  if (zero_) {
    auto z = zero_->memory();
    s.param_bytes = z.param_bytes;
    s.master_param_bytes = z.master_param_bytes;
    s.grad_bytes = z.grad_bytes;
    s.optimizer_state_bytes = z.optimizer_state_bytes;
    s.comm_buffer_bytes = z.bucket_bytes;
    s.padding_elements = z.padding_elements;
    s.offloaded_optimizer_bytes = z.offloaded_optimizer_bytes;
    s.offloaded_param_bytes = z.offloaded_param_bytes;
    s.swap_buffer_bytes = z.swap_buffer_bytes;
    s.nvme_optimizer_bytes = z.nvme_optimizer_bytes;
    s.nvme_param_bytes = z.nvme_param_bytes;
  }
  return s;
}

int64_t MemoryStats::device_bytes() const {
  return param_bytes + master_param_bytes + grad_bytes + optimizer_state_bytes +
         comm_buffer_bytes - offloaded_optimizer_bytes - offloaded_param_bytes;
}

int64_t MemoryStats::host_offload_bytes() const {
  return offloaded_optimizer_bytes + offloaded_param_bytes + swap_buffer_bytes;
}

runtime::ReductionStats Engine::reduction_stats() const {
  return zero_ ? zero_->reduction_stats() : runtime::ReductionStats{};
}

std::string Engine::memory_report(const std::string& when) const {
  // One line per rank: what the engine holds where (device / host offload / NVMe), then the
  // breakdown and the process's resident set. docs/offload.md has the per-combination table.
  auto m = memory_stats();
  const auto mb = [](int64_t b) { return b / 1e6; };
  const auto& z = config_.zero_optimization;
  std::string offload;
  if (z.optimizer_offload() != OffloadDevice::kNone) {
    offload = std::string("optimizer ") + offload_device_name(z.optimizer_offload());
  }
  if (z.param_offload() != OffloadDevice::kNone) {
    offload += (offload.empty() ? "" : ", ") + std::string("param ") + offload_device_name(z.param_offload());
  }
  if (offload.empty()) offload = "none";
  char buf[1024];
  std::snprintf(buf, sizeof(buf),
                "memory %s (rank %d, ZeRO-%lld, offload %s): device %.2f MB | host offload %.2f MB "
                "(optimizer %.2f, params %.2f, swap buffers %.2f) | nvme %.2f MB (optimizer %.2f, "
                "params %.2f) | parameters %.2f MB, master weights %.2f MB, gradients %.2f MB, "
                "optimizer states %.2f MB%s, reduction buffers %.2f MB, padding %lld elements; "
                "RSS %.2f MB (peak %.2f MB)",
                when.c_str(), comm::get_rank(), static_cast<long long>(z.stage), offload.c_str(),
                mb(m.device_bytes()), mb(m.host_offload_bytes()), mb(m.offloaded_optimizer_bytes),
                mb(m.offloaded_param_bytes), mb(m.swap_buffer_bytes),
                mb(m.nvme_optimizer_bytes + m.nvme_param_bytes), mb(m.nvme_optimizer_bytes),
                mb(m.nvme_param_bytes), mb(m.param_bytes), mb(m.master_param_bytes),
                mb(m.grad_bytes), mb(m.optimizer_state_bytes),
                m.optimizer_state_bytes == 0 && optimizer_ && !steady_state_reported_
                    ? " (created at the first optimizer step)"
                    : "",
                mb(m.comm_buffer_bytes),
                static_cast<long long>(m.padding_elements), mb(m.rss_bytes), mb(m.peak_rss_bytes));
  // The formula the autotuner prunes with, beside what was measured (docs/zero.md).
  int64_t num_params = 0, largest = 0;
  for (const auto& p : trainable_params_) {
    num_params += p.numel();
    largest = std::max<int64_t>(largest, p.numel());
  }
  if (device_.is_cuda()) {
    // DeepSpeed's see_memory_usage figures, from the CUDA caching allocator.
    const auto gb = [](int64_t b) { return b / double(1LL << 30); };
    std::snprintf(buf + std::strlen(buf), sizeof(buf) - std::strlen(buf),
                  "; %s MA %.2f GB Max_MA %.2f GB CA %.2f GB Max_CA %.2f GB",
                  device_.str().c_str(), gb(m.device_allocated_bytes),
                  gb(m.device_max_allocated_bytes), gb(m.device_reserved_bytes),
                  gb(m.device_max_reserved_bytes));
  }
  ModelStateInputs in = model_state_inputs(config_, num_params, largest, device_.is_cpu());
  if (autocast_dtype_ && config_.zero_optimization.stage > 0) {
    // The lower-precision modules' gradients fill their own buckets (ZeRO 1-3).
    std::vector<std::string> unmatched;
    const auto low = runtime::autocast_comm_dtypes(*module_, config_, *autocast_dtype_, &unmatched);
    for (const auto& p : trainable_params_) {
      if (low.count(p.unsafeGetTensorImpl())) in.low_precision_numel += p.numel();
    }
    in.low_precision_bytes = static_cast<int64_t>(c10::elementSize(*autocast_dtype_));
  }
  std::snprintf(buf + std::strlen(buf), sizeof(buf) - std::strlen(buf),
                "; formula: device %.2f MB at the steady state",
                mb(estimate_model_state_bytes(in).device()));
  return buf;
}

void Engine::report_out_of_memory(const std::string& during) const {
  // Every rank prints its own figures: the one that failed is rarely rank 0.
  log::warn(memory_report("at out-of-memory during " + during));
}

bool Engine::is_out_of_memory_message(const std::string& message) {
  // LibTorch's CPU allocator ("DefaultCPUAllocator: can't allocate memory ... Error code 12
  // (Cannot allocate memory)"), the engine's host allocator ("out of memory allocating"), CUDA's
  // caching allocator ("CUDA out of memory"), and a bad_alloc that crossed autograd as text.
  for (const char* marker : {"out of memory", "can't allocate memory", "Cannot allocate memory",
                             "could not allocate", "bad_alloc"}) {
    if (message.find(marker) != std::string::npos) return true;
  }
  return false;
}

void Engine::throw_out_of_memory(const std::string& during, const std::string& error) const {
  report_out_of_memory(during);
  const int rank = comm::is_initialized() ? comm::get_rank() : 0;
  const int world = comm::is_initialized() ? comm::get_world_size() : 1;
  throw OutOfMemoryError(
      "[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] out of memory during " +
      during + ": " + error + "\n" + memory_report("at out-of-memory during " + during) +
      "\nTo need less memory per rank: a smaller train_micro_batch_size_per_gpu, a higher "
      "zero_optimization.stage, or offload_optimizer / offload_param (docs/offload.md).");
}

std::vector<std::pair<std::string, double>> Engine::get_wall_clock_timers() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& t : kGlobalTimers) {
    auto it = last_step_timers_.find(t);
    out.emplace_back(t, it == last_step_timers_.end() ? 0.0 : it->second);
  }
  return out;
}

void Engine::report_progress() {
  // Matches DeepSpeed's _report_progress (rank 0), printed before global_steps moves.
  std::ostringstream os;
  os << "step=" << global_steps_ + 1 << ", skipped=" << skipped_steps_
     << ", lr=" << format_list(get_lr()) << ", mom=" << format_list(momentum_of(*optimizer_));
  log::info_rank0(os.str());
}

void Engine::print_progress() {
  // One readable line with what people watch: samples, loss, scale, norm, speed. samples/s is
  // wall time since the last line (data loading included); the running average is DeepSpeed's
  // (micro-steps only, warm-up skipped).
  const auto now = std::chrono::steady_clock::now();
  const double secs = std::chrono::duration<double>(now - progress_start_).count();
  const double sps = secs > 0 ? (global_samples_ - progress_samples_) / secs : 0.0;
  std::ostringstream line;
  line.setf(std::ios::fixed);
  line.precision(4);
  line << "step " << global_steps_ << " | samples " << global_samples_ << " | loss (rank 0) "
       << interval_loss() << " | lr " << std::scientific << std::setprecision(3)
       << (get_lr().empty() ? 0.0 : get_lr()[0]) << std::fixed << std::setprecision(4);
  if (loss_scaler_) line << " | loss_scale " << loss_scale();
  if (global_grad_norm_) line << " | grad_norm " << *global_grad_norm_;
  line << " | skipped " << skipped_steps_ << " | samples/s " << std::setprecision(2) << sps;
  if (auto avg = running_avg_samples_per_sec()) line << " (running avg " << *avg << ")";
  if (tokens_per_sample_ > 0) line << " | tokens/s " << sps * tokens_per_sample_;
  log::info_rank0(line.str());
  progress_start_ = now;
  progress_samples_ = global_samples_;
}

void Engine::log_throughput() {
  const auto m = memory_usage(device_);
  log::info_rank0(tput_timer_->report(m.allocated_bytes, m.max_allocated_bytes));
}

std::optional<double> Engine::running_avg_samples_per_sec() const {
  return tput_timer_->avg_samples_per_sec();
}

void Engine::log_timers(bool boundary) {
  // Matches DeepSpeed: micro timers every step() (with memory_breakdown, the memory figures
  // appended), global timers on the boundary; timers never started are left out. The engine
  // resets them itself after reading the step's totals.
  std::optional<runtime::TimerMemoryUsage> memory;
  if (config_.memory_breakdown) memory = memory_usage(device_);
  log::info_rank0(timers_->log(kMicroTimers, 1.0, /*reset=*/false, memory));
  if (boundary) log::info_rank0(timers_->log(kGlobalTimers, 1.0, /*reset=*/false));
}

}  // namespace deepspeed

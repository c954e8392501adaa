// PipelineEngine: executes the schedules' instructions on this stage. Activations and gradients
// move by comm::isend / recv on the pipe group; the parameters are trained by the base Engine,
// which reduces over the stage's data-parallel replicas. The instruction streams themselves are
// in schedule.cpp.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <torch/torch.h>

#include "deepspeed/comm_p2p.h"
#include "deepspeed/curriculum_scheduler.h"
#include "deepspeed/deepspeed.h"
#include "deepspeed/pipe.h"
#include "runtime/tensor_parallel/engine_autotp.h"
#include "util/check.h"
#include "util/logging.h"

namespace deepspeed::pipe {
namespace {

using Clock = std::chrono::steady_clock;
using Kind = Instruction::Kind;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Activation metadata (Note [Activation shapes]): dtype, number of dims, then the dims.
constexpr int64_t kMaxDims = 8;
constexpr int kMetaTag = 1;
constexpr int kActivationTag = 2;
constexpr int kGradTag = 3;

std::string shape_str(at::IntArrayRef shape) {
  std::ostringstream os;
  os << shape;
  return os.str();
}

const PipelineModule& checked(const std::shared_ptr<PipelineModule>& module,
                              const DeepSpeedConfig& config) {
  DS_CHECK(module != nullptr, UsageError, "PipelineEngine requires a PipelineModule");
  DS_CHECK(config.sequence_parallel_size == 1, NotSupportedError, config.source,
           ": sequence_parallel_size (", config.sequence_parallel_size,
           ") with pipeline parallelism is not supported yet");
  // DeepSpeed's PipelineEngine never updates random-LTD's schedule (its stages skip the
  // engine's forward), so its layers would keep min_value tokens for good.
  DS_CHECK(!config.data_efficiency.random_ltd.enabled, NotSupportedError, config.source,
           ": data_efficiency.data_routing.random_ltd with pipeline parallelism is not "
           "supported");
  // DeepSpeed builds a PipelineEngine for a PipelineModule and never its hybrid engine.
  DS_CHECK(!config.hybrid_engine.enabled, NotSupportedError, config.source,
           ": hybrid_engine.enabled with pipeline parallelism is not supported");
  // Matches DeepSpeed's PipelineEngine assertion.
  DS_CHECK(config.zero_optimization.stage < 2, NotSupportedError,
           "ds_config.json: zero_optimization.stage is ",
           static_cast<int>(config.zero_optimization.stage),
           "; ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (gradients are "
           "accumulated over the micro-batches of the pipeline); use stage 0 or 1");
  const auto& p = config.pipeline;
  DS_CHECK(p.stages == "auto" || p.stages == std::to_string(module->num_stages()), ConfigError,
           "ds_config.json: pipeline.stages is ", p.stages, " but the PipelineModule has ",
           module->num_stages(), " stages; set it to \"auto\" or to ", module->num_stages());
  const int module_interval = module->options().activation_checkpoint_interval;
  DS_CHECK(p.activation_checkpoint_interval == 0 || module_interval == 0 ||
               p.activation_checkpoint_interval == module_interval,
           ConfigError, "ds_config.json: pipeline.activation_checkpoint_interval is ",
           p.activation_checkpoint_interval, " but the PipelineModule was built with ",
           module_interval, "; give one of them, or the same value");
  DS_CHECK(config.batch.dp_world_size == module->groups().data().size(), ConfigError,
           "ds_config.json: the batch sizes were resolved for ", config.batch.dp_world_size,
           " data-parallel ranks but the pipeline has ", module->groups().data().size(),
           " (world / stages); load the config with the module's mpu (pipe::initialize does)");
  return *module;
}

}  // namespace

double PipeStageTimes::idle_fraction() const {
  return batch_ms > 0.0 ? 1.0 - (forward_ms + backward_ms) / batch_ms : 0.0;
}

PipelineEngine::PipelineEngine(std::shared_ptr<PipelineModule> module, DeepSpeedConfig config,
                               std::unique_ptr<torch::optim::Optimizer> optimizer,
                               LRSchedulerFactory lr_scheduler)
    // `config` is copied, not moved: checked() reads it and argument order is unspecified.
    : Engine((checked(module, config), module), config, std::move(optimizer),
             std::move(lr_scheduler), {}, module->mpu()),
      pipe_module_(std::move(module)),
      pipe_group_(pipe_module_->groups().pipe()) {
  set_step_logging(false);  // train_batch logs the batch itself
  const int interval = static_cast<int>(this->config().pipeline.activation_checkpoint_interval);
  if (interval > 0) pipe_module_->set_activation_checkpoint_interval(interval);
  // Whether any stage has auxiliary losses decides how the loss is aggregated, on every stage.
  at::Tensor any = at::full({1}, pipe_module_->has_aux_loss() ? 1 : 0, at::kLong);
  if (pipe_group_.size() > 1) comm::all_reduce(any, comm::ReduceOp::kMax, false, pipe_group_);
  pipeline_has_aux_loss_ = any.item<int64_t>() != 0;
  if (this->config().progressive_layer_drop.enabled) {
    log::warn_rank0(
        "progressive_layer_drop.enabled: the pipeline engine passes no forward kwargs to its "
        "layers (as DeepSpeed's PipelineEngine), so theta is tracked (get_pld_theta()) but no "
        "layer is dropped unless a layer reads it");
  }
}

void PipelineEngine::advance_curriculum() {
  CurriculumScheduler* curriculum = curriculum_scheduler_legacy();
  if (curriculum == nullptr) return;
  // Matches DeepSpeed's PipelineEngine: the difficulty (a sequence length) changes the
  // activations' shape, so the stages negotiate it again on the first batch and whenever the
  // difficulty changes (every stage computes the same schedule). The data iterator reads the
  // difficulty from curriculum_scheduler_legacy() to truncate its batches.
  const int64_t next = curriculum->update_difficulty(global_steps() + 1);
  if (global_steps() == 0 || curriculum->first_step) {
    curriculum->first_step = false;
  } else if (next == curriculum->get_difficulty(global_steps())) {
    return;
  }
  sent_shape_.reset();
  recv_shape_.reset();
}

int PipelineEngine::prev_rank() const { return pipe_group_.global_rank(stage_id() - 1); }
int PipelineEngine::next_rank() const { return pipe_group_.global_rank(stage_id() + 1); }

at::Tensor PipelineEngine::train_batch(const DataIterator& data_iter) {
  DS_CHECK(optimizer() != nullptr, UsageError,
           "train_batch(): the engine has no optimizer; give one in the config's \"optimizer\" "
           "section or to initialize()");
  const auto t0 = Clock::now();
  times_ = PipeStageTimes{};
  module().train();
  advance_curriculum();
  const int m = static_cast<int>(micro_batches());
  buffers_.assign(static_cast<size_t>(train_schedule_num_buffers(m, num_stages(), stage_id())),
                  Buffer{});
  losses_.clear();
  aux_losses_.clear();
  for (const auto& step : train_schedule(m, num_stages(), stage_id())) {
    for (const auto& ins : step) execute(ins, data_iter, true);
  }
  wait_sends();
  at::Tensor loss = aggregate_loss(m, /*training=*/true);
  agg_train_loss_ = loss.item<double>();
  buffers_.clear();
  times_.batch_ms = ms_since(t0);
  if (config().wall_clock_breakdown) {
    std::ostringstream os;
    os.setf(std::ios::fixed);
    os.precision(2);
    os << "[pipe stage " << stage_id() << "/" << num_stages() << "] batch " << times_.batch_ms
       << " ms | forward " << times_.forward_ms << " | backward " << times_.backward_ms
       << " | recv wait " << times_.recv_wait_ms << " | send " << times_.send_ms << " | reduce "
       << times_.reduce_ms << " | step " << times_.step_ms << " | idle "
       << 100.0 * times_.idle_fraction() << "%";
    // Every stage prints its own line: the bubble is in how the stages differ.
    std::printf("[deepspeed] [rank %d] %s\n", comm::get_rank(), os.str().c_str());
    std::fflush(stdout);
  }
  return loss;
}

at::Tensor PipelineEngine::eval_batch(const DataIterator& data_iter) {
  torch::NoGradGuard no_grad;
  advance_curriculum();
  module().eval();
  // Matches DeepSpeed: evaluation negotiates its own activation shapes, and the next
  // train_batch negotiates again (both sides reset together).
  sent_shape_.reset();
  recv_shape_.reset();
  const int m = static_cast<int>(micro_batches());
  buffers_.assign(2, Buffer{});
  losses_.clear();
  aux_losses_.clear();
  for (const auto& step : inference_schedule(m, num_stages(), stage_id())) {
    for (const auto& ins : step) execute(ins, data_iter, false);
  }
  wait_sends();
  at::Tensor loss = aggregate_loss(m, /*training=*/false);
  buffers_.clear();
  sent_shape_.reset();
  recv_shape_.reset();
  module().train();
  return loss;
}

void PipelineEngine::execute(const Instruction& ins, const DataIterator& data_iter,
                             bool training) {
  auto buffer = [&]() -> Buffer& { return buffers_.at(static_cast<size_t>(ins.buffer_id)); };
  const auto t0 = Clock::now();
  switch (ins.kind) {
    case Kind::kLoadMicroBatch:
      load_micro_batch(buffer(), data_iter);
      return;
    case Kind::kForwardPass: {
      comm::PhaseScope phase(comm::Phase::kForward);
      forward_pass(buffer(), training);
      times_.forward_ms += ms_since(t0);
      return;
    }
    case Kind::kBackwardPass: {
      comm::PhaseScope phase(comm::Phase::kBackward);
      backward_pass(buffer());
      times_.backward_ms += ms_since(t0);
      return;
    }
    case Kind::kSendActivation:
      send_activation(buffer());
      times_.send_ms += ms_since(t0);
      return;
    case Kind::kRecvActivation:
      recv_activation(buffer());
      times_.recv_wait_ms += ms_since(t0);
      return;
    case Kind::kSendGrad:
      send_grad(buffer());
      times_.send_ms += ms_since(t0);
      return;
    case Kind::kRecvGrad:
      recv_grad(buffer());
      times_.recv_wait_ms += ms_since(t0);
      return;
    case Kind::kReduceTiedGrads:
      reduce_tied_grads();
      times_.reduce_ms += ms_since(t0);
      return;
    case Kind::kReduceGrads:
      reduce_grads();
      times_.reduce_ms += ms_since(t0);
      return;
    case Kind::kOptimizerStep:
      // The gradients of every micro-batch were reduced by reduce_grads(): this is the
      // accumulation boundary.
      set_gradient_accumulation_boundary(true);
      step();
      times_.step_ms += ms_since(t0);
      return;
  }
}

void PipelineEngine::load_micro_batch(Buffer& b, const DataIterator& data_iter) {
  DS_CHECK(data_iter != nullptr, UsageError, "[pipe stage ", stage_id(),
           "] train_batch/eval_batch: the first and last stages need a data iterator");
  MicroBatch batch = data_iter();
  if (is_first_stage()) {
    DS_CHECK(batch.first.defined(), UsageError, "[pipe stage ", stage_id(),
             "] the data iterator returned no inputs (first element) for the first stage");
    // Matches DeepSpeed's PipelineEngine: the engine moves the batch to its device.
    b.inputs = batch.first.to(device(), /*non_blocking=*/true);
  }
  if (is_last_stage()) {
    DS_CHECK(batch.second.defined(), UsageError, "[pipe stage ", stage_id(),
             "] the data iterator returned no labels (second element) for the last stage");
    b.labels = batch.second.to(device(), /*non_blocking=*/true);
  }
}

void PipelineEngine::forward_pass(Buffer& b, bool training) {
  DS_INTERNAL_ASSERT(b.inputs.defined(), "ForwardPass on stage ", stage_id(), " without inputs");
  at::Tensor out;
  {
    // Matches DeepSpeed: the stage's forward runs under torch_autocast, its loss_fn after.
    std::optional<AutocastScope> autocast;
    enter_autocast(autocast);
    out = pipe_module_->forward(b.inputs);
  }
  // The auxiliary losses train (evaluation reports loss_fn's loss alone, as the model's eval
  // forward without them).
  if (training && pipe_module_->aux_loss().defined()) {
    b.aux = pipe_module_->aux_loss();
    aux_losses_.push_back(b.aux.detach().to(at::kFloat).reshape({}));
  }
  if (is_last_stage()) {
    const auto& loss_fn = pipe_module_->loss_fn();
    DS_CHECK(loss_fn != nullptr, UsageError,
             "PipelineModule: the last stage needs a loss_fn (PipelineModuleOptions::loss_fn)");
    at::Tensor loss = loss_fn(out, b.labels);
    DS_CHECK(loss.numel() == 1, UsageError, "PipelineModule: loss_fn returned shape ",
             shape_str(loss.sizes()), "; expected a scalar");
    losses_.push_back(loss.detach().to(at::kFloat).reshape({}));
    b.outputs = training ? loss : at::Tensor();
  } else {
    b.outputs = out;
  }
  if (!training) b.inputs = at::Tensor();
}

void PipelineEngine::backward_pass(Buffer& b) {
  // Every micro-batch accumulates into param.grad (with bf16 at stage 0, into fp32 sums, as
  // DeepSpeed's BF16_Optimizer: Note [fp32 gradient accumulation]); the data-parallel
  // reduction happens once, in reduce_grads(), after the tied gradients were summed
  // (DeepSpeed's ReduceTiedGrads before ReduceGrads).
  // Matches Engine::backward: loss / gradient_accumulation_steps, times the fp16 loss scale.
  const int64_t gas = gradient_accumulation_steps();
  auto scale = [&](at::Tensor t) {
    if (gas > 1) t = t / static_cast<double>(gas);
    return config().fp16.enabled ? t * loss_scale() : t;
  };
  const double coef = pipe_module_->options().aux_loss_coef;
  if (is_last_stage()) {
    at::Tensor loss = b.aux.defined() ? b.outputs + coef * b.aux : b.outputs;
    scale(loss).backward();
  } else {
    DS_INTERNAL_ASSERT(b.grad.defined(), "BackwardPass on stage ", stage_id(),
                       " before its gradient arrived");
    if (b.aux.defined()) {
      // This stage's share of the loss: the same gradient as if the auxiliary losses travelled
      // to the last stage with the activation and were added to its loss there.
      torch::autograd::backward({b.outputs, scale(coef * b.aux)},
                                {b.grad, at::ones_like(b.aux)});
    } else {
      torch::autograd::backward({b.outputs}, {b.grad});
    }
  }
  end_micro_batch_backward();
  b.outputs = at::Tensor();
  b.grad = at::Tensor();
  b.aux = at::Tensor();
}

void PipelineEngine::send_activation(Buffer& b) {
  at::Tensor act = b.outputs.detach().contiguous();
  const std::vector<int64_t> shape = act.sizes().vec();
  if (!sent_shape_) {
    DS_CHECK(static_cast<int64_t>(shape.size()) <= kMaxDims, UsageError, "[pipe stage ",
             stage_id(), "] the activation has ", shape.size(), " dims; at most ", kMaxDims,
             " can be passed between stages");
    at::Tensor meta = at::zeros({2 + kMaxDims}, at::kLong);
    meta[0] = static_cast<int64_t>(act.scalar_type());
    meta[1] = static_cast<int64_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) meta[2 + static_cast<int64_t>(i)] = shape[i];
    comm::send(meta, next_rank(), pipe_group_, kMetaTag);
    sent_shape_ = shape;
  } else {
    DS_CHECK(shape == *sent_shape_, UsageError, "[pipe stage ", stage_id(), "/", num_stages(),
             "] a micro-batch's activation has shape ", shape_str(shape),
             " but the shape negotiated with stage ", stage_id() + 1,
             " on the first micro-batch is ", shape_str(*sent_shape_),
             "; every micro-batch must have the same shape (batch size and sequence length) "
             "through the pipeline");
  }
  pending_sends_.push_back({comm::isend(act, next_rank(), pipe_group_, kActivationTag), act});
}

void PipelineEngine::recv_activation(Buffer& b) {
  if (!recv_shape_) {
    at::Tensor meta = at::zeros({2 + kMaxDims}, at::kLong);
    comm::recv(meta, prev_rank(), pipe_group_, kMetaTag);
    recv_dtype_ = static_cast<at::ScalarType>(meta[0].item<int64_t>());
    const int64_t ndim = meta[1].item<int64_t>();
    std::vector<int64_t> shape;
    for (int64_t i = 0; i < ndim; ++i) shape.push_back(meta[2 + i].item<int64_t>());
    recv_shape_ = shape;
  }
  at::Tensor act = at::empty(*recv_shape_, at::TensorOptions().dtype(recv_dtype_).device(device()));
  comm::recv(act, prev_rank(), pipe_group_, kActivationTag);
  if (at::isFloatingType(recv_dtype_) && torch::GradMode::is_enabled()) act.requires_grad_(true);
  b.inputs = act;
}

void PipelineEngine::send_grad(Buffer& b) {
  DS_INTERNAL_ASSERT(b.inputs.defined() && b.inputs.requires_grad(), "SendGrad on stage ",
                     stage_id(), " without a received activation");
  at::Tensor g = b.inputs.grad();
  if (!g.defined()) g = at::zeros_like(b.inputs);  // the stage did not use its input
  g = g.contiguous();
  pending_sends_.push_back({comm::isend(g, prev_rank(), pipe_group_, kGradTag), g});
  b.inputs = at::Tensor();
}

void PipelineEngine::recv_grad(Buffer& b) {
  DS_INTERNAL_ASSERT(b.outputs.defined(), "RecvGrad on stage ", stage_id(),
                     " for a buffer without outputs");
  at::Tensor g = at::empty(b.outputs.sizes(), b.outputs.options());
  comm::recv(g, next_rank(), pipe_group_, kGradTag);
  b.grad = g;
}

void PipelineEngine::wait_sends() {
  const auto t0 = Clock::now();
  for (auto& s : pending_sends_) s.handle.wait();
  pending_sends_.clear();
  times_.send_ms += ms_since(t0);
}

void PipelineEngine::reduce_tied_grads() {
  // With bf16 the gradients are summed in fp32 apart from param.grad (DeepSpeed's
  // BF16_Optimizer, which all-reduces the tied weights' _hp_grad).
  auto grad_of = [this](const at::Tensor& w) { return fp32_grad_sum(w); };
  pipe_module_->allreduce_tied_weight_gradients(grad_of);
  // The copies of a tied weight on the stages after the first hold the same gradient; the
  // norm counts it once (DeepSpeed's ds_pipe_replicated). Its share is the data-parallel
  // average, which the reduction below produces for the optimizer.
  replicated_tied_norm_sq_ = 0.0;
  const comm::Group& dp = data_parallel_group();
  for (const auto& w : pipe_module_->replicated_tied_parameters()) {
    at::Tensor sum = grad_of(w);
    at::Tensor g = (sum.defined() ? sum : w.grad()).to(at::kFloat).contiguous().clone();
    if (dp.size() > 1) comm::all_reduce(g, comm::ReduceOp::kAvg, false, dp);
    const double n = g.norm().item<double>();
    replicated_tied_norm_sq_ += n * n;
  }
}

void PipelineEngine::reduce_grads() {
  // The base engine reduces gradients from its hooks during a backward on the accumulation
  // boundary. A backward of zero touching every parameter fires them once each, after every
  // micro-batch's gradient (and the tied sums) are in param.grad; it adds nothing to them.
  at::Tensor zero;
  for (const auto& p : module().parameters()) {
    if (!p.requires_grad()) continue;
    at::Tensor term = (p * 0).sum();
    zero = zero.defined() ? zero + term : term;
  }
  if (!zero.defined()) return;
  set_gradient_accumulation_boundary(true);
  backward(zero);
}

double PipelineEngine::model_parallel_norm_squared(double dp_norm_squared) const {
  // Each stage's parameters are its own: the squares add up over the pipeline, the tied copies
  // after the first stage excluded. With tensor parallelism inside the stages, a rank other
  // than its tensor-parallel group's first already left the replicated parameters (the tied
  // ones among them) out (exclude_replicated_from_norm), and the squares add up over that
  // group too.
  const std::optional<comm::Group> tp = runtime::tensor_parallel_group_of(pipe_module_->parameters());
  const bool tp_first = !tp || tp->rank() == 0;
  at::Tensor t = at::full({1}, dp_norm_squared - (tp_first ? replicated_tied_norm_sq_ : 0.0),
                          at::TensorOptions().dtype(at::kDouble));
  if (pipe_group_.size() > 1) comm::all_reduce(t, comm::ReduceOp::kSum, false, pipe_group_);
  if (tp && tp->size() > 1) comm::all_reduce(t, comm::ReduceOp::kSum, false, *tp);
  return t.item<double>();
}

at::Tensor PipelineEngine::aggregate_loss(int micro_batches, bool training) {
  if (pipeline_has_aux_loss_) return aggregate_loss_with_aux(micro_batches, training);
  // Matches DeepSpeed's _aggregate_total_loss: the last stage averages over the micro-batches
  // and the data-parallel replicas, then broadcasts to the other stages.
  at::Tensor loss = at::zeros({1}, at::kFloat);
  if (is_last_stage()) {
    for (const auto& l : losses_) loss += l;
    loss /= static_cast<double>(micro_batches);
    const comm::Group& dp = data_parallel_group();
    if (dp.size() > 1) comm::all_reduce(loss, comm::ReduceOp::kAvg, false, dp);
  }
  if (pipe_group_.size() > 1) {
    comm::broadcast(loss, pipe_group_.global_rank(num_stages() - 1), false, pipe_group_);
  }
  losses_.clear();
  return loss.reshape({});
}

at::Tensor PipelineEngine::aggregate_loss_with_aux(int micro_batches, bool training) {
  // As aggregate_loss, and every stage adds its auxiliary losses: [loss_fn's, auxiliary] per
  // stage, averaged over the micro-batches and the stage's replicas, then summed over the
  // stages (each term lives on one stage only).
  at::Tensor terms = at::zeros({2}, at::kFloat);
  for (const auto& l : losses_) terms[0] += l;
  for (const auto& a : aux_losses_) terms[1] += a;
  terms /= static_cast<double>(micro_batches);
  const comm::Group& dp = data_parallel_group();
  if (dp.size() > 1) comm::all_reduce(terms, comm::ReduceOp::kAvg, false, dp);
  if (pipe_group_.size() > 1) comm::all_reduce(terms, comm::ReduceOp::kSum, false, pipe_group_);
  losses_.clear();
  aux_losses_.clear();
  if (!training) return terms[0].clone();
  agg_aux_loss_ = terms[1].item<double>();
  return terms[0] + pipe_module_->options().aux_loss_coef * terms[1];
}

std::shared_ptr<PipelineEngine> initialize(std::shared_ptr<PipelineModule> module,
                                           const DeepSpeedConfig& config,
                                           std::unique_ptr<torch::optim::Optimizer> optimizer,
                                           LRSchedulerFactory lr_scheduler) {
  return std::make_shared<PipelineEngine>(std::move(module), config, std::move(optimizer),
                                          std::move(lr_scheduler));
}

std::shared_ptr<PipelineEngine> initialize(std::shared_ptr<PipelineModule> module,
                                           const json& config,
                                           std::unique_ptr<torch::optim::Optimizer> optimizer,
                                           LRSchedulerFactory lr_scheduler) {
  DS_CHECK(module != nullptr, UsageError, "pipe::initialize requires a PipelineModule");
  DeepSpeedConfig resolved = load_config(config, module->mpu().get());
  return initialize(std::move(module), resolved, std::move(optimizer), std::move(lr_scheduler));
}

}  // namespace deepspeed::pipe

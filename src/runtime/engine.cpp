// Engine: orchestrates a training step (see engine.h). The pieces live elsewhere: gradient
// reduction in grad_reducer, clipping in grad_clip, optimizer/scheduler construction in optim/.
#include "deepspeed/engine.h"

#include <cstdio>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include "runtime/grad_clip.h"
#include "runtime/grad_reducer.h"
#include "runtime/host_caching_allocator.h"
#include "runtime/optim/optimizer_factory.h"
#include "runtime/timers.h"
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
    if (auto* a = dynamic_cast<torch::optim::AdamWOptions*>(&o)) {
      out.push_back(std::get<0>(a->betas()));
    } else if (auto* b = dynamic_cast<torch::optim::AdamOptions*>(&o)) {
      out.push_back(std::get<0>(b->betas()));
    }
  }
  return out;
}

}  // namespace

Engine::Engine(std::shared_ptr<torch::nn::Module> module, DeepSpeedConfig config,
               std::unique_ptr<torch::optim::Optimizer> optimizer,
               LRSchedulerFactory lr_scheduler)
    : module_(std::move(module)), config_(std::move(config)),
      timers_(std::make_unique<runtime::Timers>()) {
  DS_CHECK(module_ != nullptr, UsageError, "deepspeed::initialize requires a model");
  comm::init_distributed();
  comm::PhaseScope phase(comm::Phase::kInit);
  // See runtime/host_caching_allocator.h: large CPU activations are reused, not re-faulted.
  if (env::get_int("DS_HOST_CACHING_ALLOCATOR").value_or(1) != 0) {
    runtime::install_host_caching_allocator();
  }
  const int world = comm::get_world_size();
  DS_CHECK(config_.batch.dp_world_size == world, ConfigError, config_.source,
           ": the batch triad was resolved for ", config_.batch.dp_world_size,
           " data-parallel ranks but this job has WORLD_SIZE=", world,
           "; load the config after init_distributed() or with the job's world size");
  config_.check_supported();
  for (const auto& w : config_.warnings) log::warn_rank0(w);
  if (config_.seed) torch::manual_seed(static_cast<uint64_t>(*config_.seed));

  for (auto& p : module_->parameters()) {
    if (p.requires_grad()) trainable_params_.push_back(p);
  }
  broadcast_parameters();
  build_optimizer(std::move(optimizer), std::move(lr_scheduler));

  if (world > 1 && !trainable_params_.empty()) {
    runtime::GradReducerOptions ro;
    ro.bucket_numel = config_.zero_optimization.reduce_bucket_size;
    ro.prescale = config_.prescale_gradients;
    ro.predivide_factor = config_.gradient_predivide_factor;
    ro.average = config_.gradient_allreduce_op == "mean";
    reducer_ = std::make_unique<runtime::GradReducer>(trainable_params_, ro);
  }
  if (config_.dump_state) log::info_rank0("config: " + config_.resolved().dump(2));
  std::ostringstream os;
  os << "engine ready: world_size=" << world << " zero_stage=" << config_.zero_optimization.stage
     << " train_batch_size=" << config_.batch.train_batch_size
     << " micro_batch=" << config_.batch.train_micro_batch_size_per_gpu
     << " grad_accum=" << config_.batch.gradient_accumulation_steps
     << " trainable_params=" << trainable_params_.size()
     << " buckets=" << (reducer_ ? reducer_->num_buckets() : 0);
  log::info_rank0(os.str());
  throughput_start_ = std::chrono::steady_clock::now();
}

Engine::~Engine() = default;

void Engine::broadcast_parameters() {
  if (comm::get_world_size() == 1) return;
  // Matches DeepSpeed: every rank starts from rank 0's parameters. One flat broadcast per dtype
  // keeps this a handful of collectives whatever the number of tensors.
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> all = module_->parameters();
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (auto& p : all) by_dtype[p.scalar_type()].push_back(p);
  for (auto& [dtype, ps] : by_dtype) {
    std::vector<at::Tensor> flat_views;
    for (auto& p : ps) flat_views.push_back(p.detach().reshape({-1}));
    at::Tensor flat = at::cat(flat_views);
    comm::broadcast(flat, 0);
    int64_t off = 0;
    for (auto& p : ps) {
      p.detach().view({-1}).copy_(flat.narrow(0, off, p.numel()));
      off += p.numel();
    }
  }
}

void Engine::build_optimizer(std::unique_ptr<torch::optim::Optimizer> client,
                             LRSchedulerFactory lr_scheduler) {
  if (client) {
    optimizer_ = std::move(client);
  } else if (config_.optimizer.present) {
    optimizer_ = optim::build_optimizer(config_.optimizer, trainable_params_, config_.source);
  }
  if (!optimizer_) return;  // backward()/step() refuse later, as DeepSpeed's DummyOptim does
  if (lr_scheduler) {
    lr_scheduler_ = lr_scheduler(*optimizer_);
  } else if (config_.scheduler.present) {
    std::vector<double> base;
    for (auto& g : optimizer_->param_groups()) base.push_back(g.options().get_lr());
    auto* opt = optimizer_.get();
    lr_scheduler_ = std::make_unique<optim::LRScheduler>(
        optim::make_lr_function(config_.scheduler, config_.source), base,
        [opt](size_t g, double lr) { opt->param_groups()[g].options().set_lr(lr); });
  }
}

void Engine::forward_begin() {
  comm::set_phase(comm::Phase::kForward);
  timers_->start("fwd_microstep");
  timers_->start("fwd");
}

void Engine::forward_end() {
  timers_->stop("fwd");
  timers_->stop("fwd_microstep");
}

bool Engine::is_gradient_accumulation_boundary() const {
  if (boundary_override_) return *boundary_override_;
  if (!config_.managed_gradient_accumulation) return true;
  return (micro_steps_ + 1) % config_.batch.gradient_accumulation_steps == 0;
}

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
  if (reducer_ && boundary) reducer_->prepare();
  // Matches DeepSpeed: gradients are averaged over the accumulation steps (reference §5.2).
  const int64_t gas = config_.managed_gradient_accumulation
                          ? config_.batch.gradient_accumulation_steps
                          : 1;
  at::Tensor scaled = gas > 1 ? loss / static_cast<double>(gas) : loss;
  timers_->start("bwd_inner_microstep");
  timers_->start("bwd_inner");
  scaled.backward();
  timers_->stop("bwd_inner");
  timers_->stop("bwd_inner_microstep");
  if (reducer_ && boundary) {
    timers_->start("bwd_allreduce_microstep");
    timers_->start("bwd_allreduce");
    reducer_->finish();
    timers_->stop("bwd_allreduce");
    timers_->stop("bwd_allreduce_microstep");
  }
  timers_->stop("bwd");
  timers_->stop("bwd_microstep");
  return scaled.detach();
}

void Engine::step() {
  DS_CHECK(optimizer_ != nullptr, UsageError,
           "engine.step(): the engine has no optimizer; give one in the config's \"optimizer\" "
           "section or to deepspeed::initialize()");
  DS_CHECK(reducer_ == nullptr || !reducer_->armed(), UsageError,
           "engine.step(): the last backward on the accumulation boundary did not finish");
  comm::PhaseScope phase(comm::Phase::kStep);
  timers_->start("step_microstep");
  const bool boundary = is_gradient_accumulation_boundary();
  if (boundary) {
    timers_->start("step");
    torch::NoGradGuard no_grad;
    // Matches DeepSpeed's ZeRO-0 reduction: a trainable parameter that got no gradient (unused
    // in this step's graph) steps with a zero gradient, on one rank as on many, so that the
    // result does not depend on the world size (the reducer zero-fills them when W > 1).
    for (auto& p : trainable_params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    double norm = runtime::global_grad_norm(trainable_params_);
    global_grad_norm_ = norm;
    runtime::clip_grads_by_norm(trainable_params_, norm, config_.gradient_clipping);
    optimizer_->step();
    zero_grad();
    // Matches DeepSpeed: the schedule advances after the optimizer (never on skipped steps).
    if (lr_scheduler_) lr_scheduler_->step();
    if (config_.steps_per_print && (global_steps_ + 1) % *config_.steps_per_print == 0) {
      print_progress();
    }
    global_steps_ += 1;
    global_samples_ += config_.batch.train_batch_size;
    timers_->stop("step");
  }
  timers_->stop("step_microstep");
  if (config_.wall_clock_breakdown) log_timers(boundary);
  for (const auto& t : kMicroTimers) timers_->reset(t);
  if (boundary) {
    for (const auto& t : kGlobalTimers) last_step_timers_[t] = timers_->elapsed_ms(t);
    for (const auto& t : kGlobalTimers) timers_->reset(t);
  }
  micro_steps_ += 1;
  boundary_override_.reset();
  comm::set_phase(comm::Phase::kOther);
}

void Engine::zero_grad() {
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
  return s;
}

std::vector<std::pair<std::string, double>> Engine::get_wall_clock_timers() const {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& t : kGlobalTimers) {
    auto it = last_step_timers_.find(t);
    out.emplace_back(t, it == last_step_timers_.end() ? 0.0 : it->second);
  }
  return out;
}

void Engine::print_progress() {
  std::ostringstream os;
  os << "step=" << global_steps_ + 1 << ", skipped=" << skipped_steps_
     << ", lr=" << format_list(get_lr()) << ", mom=" << format_list(momentum_of(*optimizer_));
  log::info_rank0(os.str());
  if (!config_.timers_throughput.enabled) return;
  // Throughput over the steps since the last print (DeepSpeed starts after 2 warm-up steps).
  auto now = std::chrono::steady_clock::now();
  double secs = std::chrono::duration<double>(now - throughput_start_).count();
  int64_t samples = (global_steps_ + 1) * config_.batch.train_batch_size - throughput_samples_;
  auto mem = memory_stats();
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "epoch=0/micro_step=%lld/global_step=%lld, CurrSamplesPerSec=%.2f, "
                "RSS=%.2fGB, MaxRSS=%.2fGB",
                static_cast<long long>(micro_steps_ + 1),
                static_cast<long long>(global_steps_ + 1), secs > 0 ? samples / secs : 0.0,
                mem.rss_bytes / 1e9, mem.peak_rss_bytes / 1e9);
  log::info_rank0(buf);
  throughput_start_ = now;
  throughput_samples_ += samples;
}

void Engine::log_timers(bool boundary) {
  log::info_rank0(timers_->format(kMicroTimers));
  if (boundary) log::info_rank0(timers_->format(kGlobalTimers));
}

}  // namespace deepspeed

// ZeRO stage 0: replicated parameters, gradients and optimizer states. Gradients are averaged by
// the bucketed all-reduce of GradReducer on the accumulation boundary; the optimizer then steps
// every parameter on every rank.
#include <cmath>
#include <optional>
#include <set>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "comm/communicator.h"
#include "deepspeed/onebit.h"
#include "runtime/grad_clip.h"
#include "runtime/precision/overflow_check.h"
#include "runtime/grad_reducer.h"
#include "runtime/zero/flat_zero_optimizer.h"

namespace deepspeed::runtime {
namespace {

// Its checkpoint is FlatZeroOptimizer's with no flat groups: the optimizer's own state dict.
class Stage0 final : public FlatZeroOptimizer {
 public:
  explicit Stage0(const ZeroContext& ctx)
      : FlatZeroOptimizer(0, ctx.dp_group.rank(), ctx.dp_group.size()),
        optimizer_(ctx.optimizer), params_(ctx.trainable_params) {
    const auto& cfg = *ctx.config;
    if (ctx.dp_group.size() > 1 && !params_.empty()) {
      GradReducerOptions ro;
      ro.bucket_numel = cfg.zero_optimization.reduce_bucket_numel();
      ro.prescale = cfg.prescale_gradients;
      ro.predivide_factor = cfg.gradient_predivide_factor;
      ro.average = cfg.gradient_allreduce_op == "mean";
      ro.group = ctx.dp_group;
      reducer_ = std::make_unique<GradReducer>(params_, ro);
    }
    // A 1-bit optimizer all-reduces (compressed) on its own once warm-up ends.
    compressed_ = dynamic_cast<onebit::CompressedCommunication*>(optimizer_);
    if (compressed_) compressed_->set_data_parallel_group(ctx.dp_group);
  }

  void begin_backward(bool boundary) override {
    reducing_ = reducer_ && boundary &&
                (compressed_ == nullptr || compressed_->backward_allreduce_enabled());
    if (reducing_) reducer_->prepare();
  }
  void end_backward(bool boundary) override {
    if (reducing_ && boundary) reducer_->finish();
    if (boundary) last_boundary_reduced_ = reducing_;
    reducing_ = false;
  }

  double grad_norm_squared() override {
    // Matches DeepSpeed's ZeRO-0 reduction: a trainable parameter that got no gradient (unused
    // in this step's graph) steps with a zero gradient, on one rank as on many, so that the
    // result does not depend on the world size (the reducer zero-fills them when W > 1).
    for (auto& p : params_) {
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    }
    // Replicated after the all-reduce: local is global.
    double n = global_grad_norm(norm_params_ ? *norm_params_ : params_);
    return n * n;
  }

  void exclude_from_norm(const std::vector<at::Tensor>& params) override {
    std::set<const void*> out;
    for (const auto& p : params) out.insert(p.unsafeGetTensorImpl());
    norm_params_.emplace();
    for (const auto& p : params_) {
      if (!out.count(p.unsafeGetTensorImpl())) norm_params_->push_back(p);
    }
  }

  void scale_gradients(double coef) override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }

  void optimizer_step() override { optimizer_->step(); }

  bool local_overflow() override {
    std::vector<at::Tensor> grads;
    for (const auto& p : params_) grads.push_back(p.grad());
    return has_inf_or_nan(grads);
  }

  void zero_grad() override {
    for (auto& p : params_) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
  }

  ZeroMemory memory() const override {
    ZeroMemory m;
    for (const auto& p : params_) {
      m.param_bytes += p.numel() * static_cast<int64_t>(p.element_size());
      m.grad_bytes += p.numel() * static_cast<int64_t>(p.element_size());
    }
    m.optimizer_state_bytes = optimizer_state_bytes(*optimizer_);
    m.bucket_bytes = reducer_ ? reducer_->bucket_bytes() : 0;
    return m;
  }

  ReductionStats reduction_stats() const override {
    ReductionStats s;
    if (reducer_ && last_boundary_reduced_) {
      s.buckets_launched = reducer_->last_buckets_launched();
      s.buckets_launched_from_hooks = reducer_->last_buckets_launched_from_hooks();
      s.reductions_issued = s.buckets_launched;
    }
    return s;
  }
  int64_t num_buckets() const override {
    return reducer_ ? static_cast<int64_t>(reducer_->num_buckets()) : 0;
  }
  bool backward_pending() const override { return reducer_ && reducer_->armed(); }

 private:
  torch::optim::Optimizer* optimizer_;
  std::vector<at::Tensor> params_;
  std::optional<std::vector<at::Tensor>> norm_params_;  // set by exclude_from_norm
  std::unique_ptr<GradReducer> reducer_;
  onebit::CompressedCommunication* compressed_ = nullptr;
  bool reducing_ = false;  // this backward's gradients go through reducer_
  bool last_boundary_reduced_ = true;  // false after a boundary left to a 1-bit optimizer
};

}  // namespace

std::unique_ptr<ZeroOptimizer> make_stage0(const ZeroContext& context) {
  if (context.model_dtype != at::kFloat) return make_stage1_2(context);
  return std::make_unique<Stage0>(context);
}

}  // namespace deepspeed::runtime

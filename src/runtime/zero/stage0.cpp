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
#include "deepspeed/optimizers.h"
#include "runtime/grad_clip.h"
#include "runtime/precision/overflow_check.h"
#include "runtime/grad_reducer.h"
#include "runtime/zero/flat_zero_optimizer.h"
#include "runtime/zero/moe_param_groups.h"
#include "runtime/zero/reducer_list.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

// Its checkpoint is FlatZeroOptimizer's with no flat groups: the optimizer's own state dict (in
// the expp_rank files of DeepSpeed's MoE layout with MoE layers).
class Stage0 final : public FlatZeroOptimizer {
 public:
  explicit Stage0(const ZeroContext& ctx)
      : FlatZeroOptimizer(0, ctx.dp_group.rank(), ctx.dp_group.size()),
        optimizer_(ctx.optimizer), params_(ctx.trainable_params) {
    const auto& cfg = *ctx.config;
    GradReducerOptions ro;
    ro.bucket_numel = cfg.zero_optimization.reduce_bucket_numel();
    ro.prescale = cfg.prescale_gradients;
    ro.predivide_factor = cfg.gradient_predivide_factor;
    ro.average = cfg.gradient_allreduce_op == "mean";
    ro.group = ctx.dp_group;
    ro.average_divisor = ctx.average_divisor;
    ro.sparse = ctx.sparse_gradients;
    // MoE: expert parameters are averaged over their expert-data-parallel group, everything
    // else over the data-parallel group (DeepSpeed's buffered_allreduce_fallback).
    std::set<const void*> expert_keys;
    for (const auto& e : ctx.expert_params) {
      for (const auto& p : e.params) expert_keys.insert(p.unsafeGetTensorImpl());
    }
    std::vector<at::Tensor> dense;
    for (const auto& p : params_) {
      if (!expert_keys.count(p.unsafeGetTensorImpl())) dense.push_back(p);
    }
    if (ctx.dp_group.size() > 1 && !dense.empty()) {
      reducers_.push_back(std::make_unique<GradReducer>(dense, ro));
    }
    for (const auto& e : ctx.expert_params) {
      if (e.params.empty()) continue;
      experts_.push_back(ExpertPart{e.params, e.expert_parallel, std::nullopt});
      if (ctx.dp_group.size() == 1) continue;
      GradReducerOptions eo = ro;
      eo.group = e.expert_data_parallel;
      eo.average_divisor = ctx.dp_group.size();
      if (e.expert_data_parallel.size() > 1) {
        reducers_.push_back(std::make_unique<GradReducer>(e.params, eo));
      } else {
        // Every rank holds other experts (ep_size = world): nothing to sum, only the divide.
        experts_.back().local_divisor = eo;
      }
    }
    // DeepSpeed's MoE param groups (moe_param_groups.h): they shape the optimizer's state dict.
    use_moe_checkpoint(ctx.module, ctx.expert_params,
                       split_moe_param_groups(*optimizer_, ctx.expert_params));
    // A 1-bit optimizer all-reduces (compressed) on its own once warm-up ends.
    compressed_ = dynamic_cast<onebit::CompressedCommunication*>(optimizer_);
    if (compressed_) compressed_->set_data_parallel_group(ctx.dp_group);
  }

  void begin_backward(bool boundary) override {
    reducing_ = boundary && (compressed_ == nullptr || compressed_->backward_allreduce_enabled());
    if (reducing_) {
      for (auto& r : reducers_) r->prepare();
    }
  }
  void end_backward(bool boundary) override {
    if (reducing_ && boundary) {
      for (auto& r : reducers_) r->finish();
      for (auto& e : experts_) {
        if (e.local_divisor) divide_locally(e.params, *e.local_divisor);
      }
    }
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
    // Replicated after the all-reduce, so the local norm is the global one (less what
    // exclude_from_norm left out); but each rank holds only its experts: their squares are
    // summed over the expert-parallel group (DeepSpeed's get_norm_with_moe_layers), each expert
    // counted once.
    const std::vector<at::Tensor>& counted = norm_params_ ? *norm_params_ : params_;
    std::set<const void*> expert_keys;
    double experts_squared = 0.0;
    for (const auto& e : experts_) {
      std::vector<at::Tensor> grads;
      for (const auto& p : e.params) {
        expert_keys.insert(p.unsafeGetTensorImpl());
        // A replicated expert parameter (a row-parallel bias under AutoTP) counts on one
        // tensor-parallel rank only, as the dense ones.
        if (!norm_excluded_.count(p.unsafeGetTensorImpl())) grads.push_back(p.grad());
      }
      double sq = squared_l2_norm(grads);
      if (e.expert_parallel.size() > 1) sq = sum_over_group(sq, e.expert_parallel);
      experts_squared += sq;
    }
    if (experts_.empty()) {
      double n = global_grad_norm(counted);
      return n * n;
    }
    std::vector<at::Tensor> dense;
    for (const auto& p : counted) {
      if (!expert_keys.count(p.unsafeGetTensorImpl())) dense.push_back(p.grad());
    }
    return squared_l2_norm(dense) + experts_squared;
  }

  void exclude_from_norm(const std::vector<at::Tensor>& params) override {
    for (const auto& p : params) norm_excluded_.insert(p.unsafeGetTensorImpl());
    norm_params_.emplace();
    for (const auto& p : params_) {
      if (!norm_excluded_.count(p.unsafeGetTensorImpl())) norm_params_->push_back(p);
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
    for (const auto& r : reducers_) m.bucket_bytes += r->bucket_bytes();
    return m;
  }

  ReductionStats reduction_stats() const override {
    ReductionStats s;
    if (last_boundary_reduced_) {
      for (const auto& r : reducers_) {
        s.buckets_launched += r->last_buckets_launched();
        s.buckets_launched_from_hooks += r->last_buckets_launched_from_hooks();
        s.sparse_rows_sent += r->last_sparse_rows();
      }
      s.reductions_issued = s.buckets_launched;
    }
    return s;
  }
  int64_t num_buckets() const override { return total_buckets(reducers_); }
  bool backward_pending() const override { return any_armed(reducers_); }

 private:
  torch::optim::Optimizer* optimizer_;
  std::vector<at::Tensor> params_;
  struct ExpertPart {
    std::vector<at::Tensor> params;
    comm::Group expert_parallel;
    std::optional<GradReducerOptions> local_divisor;  // set: no one to sum with, divide only
  };
  // GradReducer's arithmetic on a group of one: DeepSpeed's allreduce_bucket scaling with
  // nothing to sum (a parameter without a gradient gets zeros, as the reducer gives it).
  static void divide_locally(const std::vector<at::Tensor>& params, const GradReducerOptions& o) {
    const double w = o.average_divisor;
    double factor = 1.0;
    if (o.prescale) {
      factor = 1.0 / w;
    } else {
      factor = 1.0 / o.predivide_factor;
      if (o.average && o.predivide_factor != w) factor *= o.predivide_factor / w;
    }
    for (auto p : params) {
      if (!p.grad().defined()) {
        p.mutable_grad() = at::zeros_like(p);
      } else {
        p.mutable_grad().mul_(factor);
      }
    }
  }

  std::vector<std::unique_ptr<GradReducer>> reducers_;  // data-parallel, then expert groups
  std::vector<ExpertPart> experts_;
  std::optional<std::vector<at::Tensor>> norm_params_;  // set by exclude_from_norm
  std::set<const void*> norm_excluded_;                  // what it left out
  onebit::CompressedCommunication* compressed_ = nullptr;
  bool reducing_ = false;  // this backward's gradients go through reducers_
  bool last_boundary_reduced_ = true;  // false after a boundary left to a 1-bit optimizer
};

}  // namespace

std::unique_ptr<ZeroOptimizer> make_stage0(const ZeroContext& context) {
  // 1-bit optimizers run at stage 0 only (the config refuses them with ZeRO), fp32 or 16-bit.
  DS_CHECK(context.expert_params.empty() ||
               dynamic_cast<onebit::CompressedCommunication*>(context.optimizer) == nullptr,
           NotSupportedError,
           "1-bit optimizers with MoE layers are not supported (they all-reduce every "
           "gradient over the data-parallel group)");
  if (context.model_dtype != at::kFloat) return make_stage1_2(context);
  return std::make_unique<Stage0>(context);
}

}  // namespace deepspeed::runtime

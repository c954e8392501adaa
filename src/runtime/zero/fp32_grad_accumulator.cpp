// See fp32_grad_accumulator.h.
#include "runtime/zero/fp32_grad_accumulator.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

namespace deepspeed::runtime {

// Note [fp32 gradient accumulation]
// DeepSpeed trains bf16 at ZeRO stage 1 with fp32 gradient accumulation
// (data_types.grad_accum_dtype "fp32", no offload), and bf16 pipelines at stage 0, through
// BF16_Optimizer, which keeps an fp32 gradient buffer beside the bf16 parameters: before each
// backward it zeroes the bf16 gradients, after it adds them into the fp32 buffer
// (update_hp_grads), and on the accumulation boundary it reduces the fp32 buffer, cast to
// communication_data_type. ZeRO's own stage 1 instead lets param.grad sum the micro-steps in
// bf16, which rounds every partial sum to 8 bits of mantissa. Here: accumulate() after each
// backward (a pipeline's micro-batch backward included: Engine::end_micro_batch_backward); on
// the boundary the reducer reads the sums (lend_to_params) instead of param.grad, and a
// pipeline first sums its tied weights' across stages in them (sum_for; DeepSpeed
// all-reduces their _hp_grad).
//
// bf16.immediate_grad_update moves the addition into a hook that runs as soon as autograd has
// a parameter's gradient (BF16_Optimizer's create_grad_acc_hooks): the bf16 gradient is freed
// during backward instead of living to its end. The sums are the same, bit for bit: each
// micro-step adds the same tensor into the same buffer. Releasing the gradient after each
// addition (DeepSpeed zeroes it before the next backward) also keeps a gradient that autograd
// delivers in several parts (reentrant activation checkpointing) from being added twice.

Fp32GradAccumulator::Fp32GradAccumulator(const std::vector<FlatGroup>& groups, bool immediate)
    : groups_(groups) {
  std::vector<at::Tensor> params;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const FlatGroup& fg = groups_[g];
    sums_.push_back(at::zeros({fg.numel()}, fg.flat().options().dtype(at::kFloat)));
    has_grad_.emplace_back(fg.slots().size(), false);
    for (size_t s = 0; s < fg.slots().size(); ++s) {
      params.push_back(fg.slots()[s].param);
      slot_of_[fg.slots()[s].param.unsafeGetTensorImpl()] = index_.size();
      index_.emplace_back(g, s);
    }
  }
  if (immediate) {
    hooks_ = std::make_unique<GradReadyHooks>(params, [this](size_t i) {
      add(index_[i].first, index_[i].second);
      ++added_in_backward_;
    });
  }
}

void Fp32GradAccumulator::add(size_t group, size_t slot) {
  at::NoGradGuard no_grad;
  const FlatSlot& s = groups_[group].slots()[slot];
  at::Tensor param = s.param;  // a handle: the gradient belongs to the shared impl
  if (!param.grad().defined()) return;
  sums_[group].narrow(0, s.offset, s.numel).add_(param.grad().reshape({-1}));
  has_grad_[group][slot] = true;
  param.mutable_grad() = at::Tensor();
}

void Fp32GradAccumulator::accumulate() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t s = 0; s < groups_[g].slots().size(); ++s) add(g, s);
  }
}

void Fp32GradAccumulator::lend_to_params() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (size_t s = 0; s < groups_[g].slots().size(); ++s) {
      if (!has_grad_[g][s]) continue;
      const FlatSlot& slot = groups_[g].slots()[s];
      at::Tensor param = slot.param;
      param.mutable_grad() = sums_[g].narrow(0, slot.offset, slot.numel).view(param.sizes());
    }
  }
}

void Fp32GradAccumulator::zero() {
  for (auto& sum : sums_) sum.zero_();
  for (auto& flags : has_grad_) flags.assign(flags.size(), false);
}

at::Tensor Fp32GradAccumulator::sum_for(const at::Tensor& param) {
  auto it = slot_of_.find(param.unsafeGetTensorImpl());
  if (it == slot_of_.end()) return {};
  const auto [g, s] = index_[it->second];
  has_grad_[g][s] = true;
  const FlatSlot& slot = groups_[g].slots()[s];
  return sums_[g].narrow(0, slot.offset, slot.numel).view(param.sizes());
}

int64_t Fp32GradAccumulator::bytes() const {
  int64_t total = 0;
  for (const auto& sum : sums_) total += sum.numel() * static_cast<int64_t>(sum.element_size());
  return total;
}

}  // namespace deepspeed::runtime

// See host_offload.h (Note [Overlapped offload copies]).
#include "runtime/zero/host_offload.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/scoped_grad_scale.h"
#include "util/env.h"

namespace deepspeed::runtime {

bool offload_host_path_on_cpu() {
  return env::get("DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU").value_or("") == "1";
}

HostOffload::HostOffload(c10::Device device, at::ScalarType model_dtype,
                         at::ScalarType master_dtype, torch::optim::Optimizer* optimizer)
    // Pinned memory makes both copies DMA transfers; a CPU-only LibTorch has no pinned
    // allocator (there the buffers are only separate, for tests of this logic).
    : model_dtype_(model_dtype),
      master_dtype_(master_dtype),
      optimizer_(optimizer),
      pinned_(!device.is_cpu()),
      d2h_(device) {}

at::Tensor HostOffload::add_group(const at::Tensor& device_partition) {
  const auto host = at::TensorOptions().device(at::kCPU).pinned_memory(pinned_);
  const int64_t n = device_partition.numel();
  Group g;
  g.master = at::empty({n}, host.dtype(master_dtype_));
  g.master.copy_(device_partition);
  g.grad = at::zeros({n}, host.dtype(master_dtype_));
  g.master.mutable_grad() = g.grad;
  // 16-bit masters (Note [Low-precision masters]) go back to the device as they are.
  if (model_dtype_ != master_dtype_) {
    g.half = at::empty({n}, host.dtype(model_dtype_));
    // CPU-Adam writes the 16-bit copy in the same pass as the update (DeepSpeed's
    // step-with-copy), so the host-to-device copy moves 2 bytes per element, not 4.
    if (auto* ds = dynamic_cast<optim::DsOptimizer*>(optimizer_)) ds->set_copy_out(g.master, g.half);
  }
  groups_.push_back(g);
  return g.master;
}

void HostOffload::begin_backward(bool boundary) {
  copying_ = boundary;
  copies_in_backward_ = 0;
  if (boundary) {
    grads_on_host_ = false;
    grad_scale_ = 1.0;  // a scale belongs to the step of the gradients it was computed for
  }
}

void HostOffload::on_reduced(size_t group, const at::Tensor& grad_partition, int64_t offset,
                             int64_t numel) {
  if (!copying_) return;
  at::Tensor dst = groups_.at(group).grad.narrow(0, offset, numel);
  const at::Tensor src = grad_partition.narrow(0, offset, numel);
  d2h_.enqueue_after_current([&] { dst.copy_(src, /*non_blocking=*/pinned_); });
  ++copies_in_backward_;
}

void HostOffload::end_backward(bool boundary, bool all_reduced) {
  if (boundary) grads_on_host_ = copying_ && all_reduced;
  copying_ = false;
}

void HostOffload::before_device_grad_write() { d2h_.current_waits(); }

void HostOffload::step(const std::vector<at::Tensor>& grad_partitions,
                       const std::vector<at::Tensor>& device_partitions) {
  at::NoGradGuard no_grad;
  if (!grads_on_host_) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      at::Tensor dst = groups_[g].grad;
      const at::Tensor& src = grad_partitions[g];
      d2h_.enqueue_after_current([&] { dst.copy_(src, /*non_blocking=*/pinned_); });
    }
  }
  d2h_.synchronize();
  grads_on_host_ = false;
  // A DeepSpeed optimizer scales each gradient as CPU-Adam reads it (Note [Gradient scale in
  // the step]), instead of a pass of its own over the host gradients.
  {
    ScopedGradScale scale(optimizer_, grad_scale_);
    if (!scale.taken() && grad_scale_ != 1.0) {
      for (auto& g : groups_) g.grad.mul_(grad_scale_);
    }
    grad_scale_ = 1.0;
    optimizer_->step();
  }
  auto* ds = dynamic_cast<optim::DsOptimizer*>(optimizer_);
  // Host to device: the updated partition in the model's dtype (see the Note for why the
  // pinned sources may be left in flight).
  for (size_t g = 0; g < groups_.size(); ++g) {
    at::Tensor dst = device_partitions[g];
    const Group& h = groups_[g];
    if (h.half.defined() && !(ds != nullptr && ds->wrote_copy_out(h.master))) h.half.copy_(h.master);
    dst.copy_(h.half.defined() ? h.half : h.master, /*non_blocking=*/pinned_);
  }
}

}  // namespace deepspeed::runtime

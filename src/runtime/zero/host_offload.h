// ZeRO-Offload for stages 1/2 with the model on a GPU (DeepSpeed's headline): per flat group the
// fp32 master partition, its gradient and a model-dtype copy of it live in pinned host memory,
// the optimizer (CPU-Adam) steps there, and the device keeps only the model-dtype parameters,
// the gradient partition and the reduction buckets.
//
// Note [Overlapped offload copies]
// On the accumulation boundary each reduced bucket range is copied device-to-host as soon as
// the reducer has added it into the gradient partition, on a side stream ordered after the
// compute stream by an event: the copies run while backward goes on, as DeepSpeed copies each
// reduced gradient to its CPU partition. The step then waits once, for the last copies.
//  - Whatever writes the device gradient partitions on the compute stream afterwards
//    (zero_grad) first makes it wait for the copies, so none reads a half-updated value. The
//    unscale/clip scale leaves the device partitions alone: it belongs to the host copies, and
//    CPU-Adam applies it as it reads them (DeepSpeed unscales and clips the CPU gradients too).
//  - The updated partitions go back host-to-device on the compute stream (non-blocking, so the
//    all-gather after them needs no host wait). The pinned copies they read are rewritten at the
//    next step only after the host waited on the side stream, whose copies were ordered after
//    these.
//  - A boundary whose ranges did not reach the host during backward (gradients a 1-bit
//    optimizer kept local) copies the whole partitions at the step instead.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "runtime/accelerator/side_stream.h"

namespace torch::optim {
class Optimizer;
}

namespace deepspeed::runtime {

/// DS_TEST_OFFLOAD_HOST_BUFFERS_ON_CPU=1: the CPU engine's offload takes the path of a model on a
/// GPU (host buffers beside the "device" ones, copies through a side stream that runs inline),
/// so that the CPU suite covers that logic (docs/env.md). Stages 1/2 and 3 ask it.
bool offload_host_path_on_cpu();

class HostOffload {
 public:
  /// `optimizer` steps the host masters; a DeepSpeed optimizer writes the model-dtype copy in
  /// the same pass as the update (its step-with-copy).
  /// `master_dtype`: fp32, or the model's 16-bit dtype (Note [Low-precision masters]).
  HostOffload(c10::Device device, at::ScalarType model_dtype, at::ScalarType master_dtype,
              torch::optim::Optimizer* optimizer);

  /// Host buffers for one more flat group, whose owned device partition is `device_partition`;
  /// returns the master (its .grad() is the host gradient).
  at::Tensor add_group(const at::Tensor& device_partition);

  /// The coming backward ends on the accumulation boundary when `boundary`: reduced ranges then
  /// go to the host as they complete (on_reduced).
  void begin_backward(bool boundary);
  /// The reducer added range [offset, offset + numel) of group g's gradient partition, its last
  /// change this backward.
  void on_reduced(size_t group, const at::Tensor& grad_partition, int64_t offset, int64_t numel);
  /// After the boundary's backward: `all_reduced` when every owned range went through on_reduced.
  void end_backward(bool boundary, bool all_reduced);

  /// Before the compute stream writes the device gradient partitions.
  void before_device_grad_write();
  /// Whether the boundary's gradients all reached the host during backward: then the step
  /// reads only the host copies, and the unscale/clip coefficient belongs to them (scale());
  /// else the step copies the device partitions, which take the coefficient themselves.
  bool grads_on_host() const { return grads_on_host_; }
  /// The unscale/clip coefficient, applied to the host gradients at the step.
  void scale(double coef) { grad_scale_ *= coef; }

  /// Gradients to the host (what did not go during backward), the optimizer's step there, and
  /// the updated partitions back into `device_partitions` (per group) on the compute stream.
  void step(const std::vector<at::Tensor>& grad_partitions,
            const std::vector<at::Tensor>& device_partitions);

  /// Ranges on_reduced sent to the host during the last backward (0 off the boundary).
  int64_t copies_in_backward() const { return copies_in_backward_; }

 private:
  struct Group {
    at::Tensor master;  // master dtype: the optimizer's parameter
    at::Tensor grad;    // master dtype: the reduced gradient partition
    at::Tensor half;    // model-dtype copy of an fp32 master (fp16/bf16 models only)
  };

  at::ScalarType model_dtype_;
  at::ScalarType master_dtype_;
  torch::optim::Optimizer* optimizer_;
  bool pinned_;
  SideStream d2h_;
  std::vector<Group> groups_;
  bool copying_ = false;         // this backward's reduced ranges go to the host
  bool grads_on_host_ = false;   // the boundary's gradients all went during backward
  double grad_scale_ = 1.0;
  int64_t copies_in_backward_ = 0;
};

}  // namespace deepspeed::runtime

// Gradient overflow detection for loss scaling and bf16's check_grad_overflow: does any gradient
// hold an inf or nan (local), and did any rank see one (one all-reduce MAX). What to do about it
// (skip the step, lower the scale) is the loss scaler's and the engine's business.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

namespace deepspeed::runtime {

/// True when `x` holds an inf, -inf or nan. Undefined, empty and integer tensors hold none.
/// One device->host sync. See has_inf_or_nan(vector) for the method.
bool has_inf_or_nan(const at::Tensor& x);

/// True when any tensor in `tensors` holds an inf, -inf or nan. Each tensor gets one reduction
/// that stays on its device, and the per-tensor verdicts are combined with a single
/// device->host sync at the end (DeepSpeed's ZeRO also accumulates on device before one .item()):
///  - fp32/fp64/bf16: x.sum(). A nan or inf anywhere makes the sum nan or inf (inf + -inf is
///    nan), in one pass and without a temporary the size of x. It also flags a finite gradient
///    whose sum exceeds 3.4e38, where DeepSpeed's ZeRO test would not; such a gradient's norm
///    (squares beyond 1.8e19 per element) has overflowed long before.
///  - fp16: a half sum overflows at 65504 on healthy gradients, and sum(kFloat) materialises an
///    fp32 copy on CPU, so the exponent bits are tested instead, exactly: inf and nan are the
///    values whose 5 exponent bits are all ones (max over bits & 0x7C00 == 0x7C00).
/// Measured on this machine's CPU (LibTorch 1.13, 1 thread, 16M elements): fp32 sum 2.6 ms vs
/// isfinite().all() 100 ms; fp16 exponent test 3.9 ms vs isfinite().all() 85 ms.
bool has_inf_or_nan(const std::vector<at::Tensor>& tensors);

/// True when `local_overflow` is true on any rank of `group` (the world unless given): all_reduce MAX
/// of a 1-element float flag (Gloo, CPU), so every rank takes the same skip decision. Collective:
/// every rank must call it at the same point. Without an initialised process group the process
/// is a world of one and `local_overflow` is returned. Throws CommError on a failed collective.
bool any_rank_overflow(bool local_overflow, const comm::Group& group = comm::world());

}  // namespace deepspeed::runtime

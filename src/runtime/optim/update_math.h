// Shared by the tensor-op update paths: an update is computed in fp32 for 16-bit tensors (as
// DeepSpeed's kernels do) and in the tensor's own dtype for fp32 and fp64, then stored back.
#pragma once

#include <ATen/core/Tensor.h>

namespace deepspeed::optim::detail {

inline at::ScalarType math_dtype(const at::Tensor& t) {
  return t.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

/// `t` itself when it already has `dtype` (so that in-place ops update it), else a converted copy
/// to be written back with store().
inline at::Tensor load(const at::Tensor& t, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t : t.to(dtype);
}

/// Writes `value` into `dst` unless `value` is `dst` itself.
inline void store(const at::Tensor& dst, const at::Tensor& value) {
  if (!dst.is_same(value)) dst.copy_(value);
}

}  // namespace deepspeed::optim::detail

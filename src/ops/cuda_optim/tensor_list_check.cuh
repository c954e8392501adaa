// The argument checks the fused optimizers share: a list of `count` tensors of n elements, each
// with its parameter, gradient and two moment buffers, and a 1-based step. Errors name the
// operation and the tensor.
#pragma once

#include "ops/cuda_optim/multi_tensor.cuh"
#include "util/check.h"

namespace deepspeed::ops::cuda_detail {

template <class Step, class Tensor>
void check_tensor_list(const char* op, const Step& step, const Tensor* tensors, int count) {
  DS_CHECK(count >= 0, UsageError, op, ": count is ", count, "; expected >= 0");
  DS_CHECK(count == 0 || tensors != nullptr, UsageError, op, ": null tensor list of ", count,
           " tensors");
  DS_CHECK(step.step >= 1, UsageError, op, ": step is ", step.step,
           "; expected the 1-based count of this update (increment before calling)");
  for (int i = 0; i < count; ++i) {
    const Tensor& t = tensors[i];
    DS_CHECK(t.n >= 0 && t.n <= kMaxTensorNumel, UsageError, op, ": tensor ", i, " has n = ",
             t.n, "; expected 0 <= n <= ", kMaxTensorNumel);
    DS_CHECK(t.n == 0 || (t.param != nullptr && t.grad != nullptr && t.exp_avg != nullptr &&
                          t.exp_avg_sq != nullptr),
             UsageError, op, ": tensor ", i, " has a null buffer for ", t.n, " elements");
  }
}

}  // namespace deepspeed::ops::cuda_detail

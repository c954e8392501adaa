// Fp32GradAccumulator: DeepSpeed's BF16_Optimizer way of accumulating gradients over micro-steps
// (Note [fp32 gradient accumulation] in the .cpp). Each micro-step's 16-bit gradient is added
// into an fp32 buffer of its own and released, so the sum over the micro-steps is rounded once,
// at the end, instead of after every addition in the parameter's dtype.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "runtime/zero/bucketer.h"
#include "runtime/zero/flat_group.h"

namespace deepspeed::runtime {

class Fp32GradAccumulator {
 public:
  /// One fp32 buffer per flat group (its unpadded numel). `immediate`
  /// (bf16.immediate_grad_update): each gradient is added by a hook as soon as autograd has
  /// accumulated it, during backward; otherwise by accumulate(), after backward. `groups` must
  /// outlive the accumulator and keep its parameters.
  Fp32GradAccumulator(const std::vector<FlatGroup>& groups, bool immediate);

  /// Adds every gradient still held by a parameter into its fp32 sum and releases it (after
  /// each backward; with `immediate` only what no hook saw is left).
  void accumulate();
  /// Points each parameter that got a gradient since the last zero() at its fp32 sum, for the
  /// reduction to read; the others keep none (the reducer takes them as unused).
  void lend_to_params();
  /// After the step: the sums restart at zero.
  void zero();
  /// `param`'s sum (a view in its shape), marked as holding a gradient: the caller may write
  /// it (a pipeline's tied weights are summed across stages there). Undefined for a tensor
  /// that is not one of the groups' parameters.
  at::Tensor sum_for(const at::Tensor& param);

  int64_t bytes() const;
  /// How many gradients the hooks added during backward (immediate mode), for tests.
  int64_t added_in_backward() const { return added_in_backward_; }

 private:
  void add(size_t group, size_t slot);

  const std::vector<FlatGroup>& groups_;
  std::vector<at::Tensor> sums_;             // per group, fp32
  std::vector<std::vector<bool>> has_grad_;  // per group and slot, since the last zero()
  std::vector<std::pair<size_t, size_t>> index_;  // hook index -> (group, slot)
  std::map<const void*, size_t> slot_of_;         // parameter's TensorImpl -> hook index
  int64_t added_in_backward_ = 0;
  std::unique_ptr<GradReadyHooks> hooks_;  // last: removed first
};

}  // namespace deepspeed::runtime

// ScopedGradScale: hands the unscale/clip coefficient to a DeepSpeed optimizer for the steps of
// one engine step (Note [Gradient scale in the step], deepspeed/optimizers.h), and takes it back
// however the scope ends, so a step that threw leaves no scale behind for the next one.
#pragma once

#include <torch/optim/optimizer.h>

#include "deepspeed/optimizers.h"

namespace deepspeed::runtime {

class ScopedGradScale {
 public:
  /// Whether `optimizer` can take a gradient scale (else the caller multiplies the gradients).
  static bool takes_scale(torch::optim::Optimizer* optimizer) {
    return dynamic_cast<optim::DsOptimizer*>(optimizer) != nullptr;
  }

  ScopedGradScale(torch::optim::Optimizer* optimizer, double coef)
      : optimizer_(dynamic_cast<optim::DsOptimizer*>(optimizer)) {
    if (optimizer_) optimizer_->set_grad_scale(coef);
  }
  ~ScopedGradScale() {
    if (optimizer_) optimizer_->set_grad_scale(1.0);
  }
  ScopedGradScale(const ScopedGradScale&) = delete;
  ScopedGradScale& operator=(const ScopedGradScale&) = delete;

  bool taken() const { return optimizer_ != nullptr; }

 private:
  optim::DsOptimizer* optimizer_;
};

}  // namespace deepspeed::runtime

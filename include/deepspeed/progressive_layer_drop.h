// DeepSpeed's ProgressiveLayerDrop (Zhang & He, "Accelerating Training of Transformer-Based
// Language Models with Progressive Layer Dropping", 2020): the keep-probability parameter
// theta(t) = (1 - theta) * exp(-gamma * t) + theta, starting at 1 and decaying towards the
// configured theta. The engine updates it on each accumulation boundary and passes it to the
// model's training forwards (ForwardKwargs); the model does the dropping.
#pragma once

#include <cstdint>

namespace deepspeed {

class ProgressiveLayerDrop {
 public:
  ProgressiveLayerDrop(double theta, double gamma) : theta_(theta), gamma_(gamma) {}

  double get_theta() const { return current_theta_; }

  /// theta at `global_step` (the engine's global_steps before its optimizer step).
  void update_state(int64_t global_step);

 private:
  double theta_;
  double gamma_;
  double current_theta_ = 1.0;
};

}  // namespace deepspeed

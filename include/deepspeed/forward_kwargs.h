// What DeepSpeed's engine adds to the keyword arguments of a training forward: progressive layer
// drop's state and legacy curriculum learning's sequence length. C++ has no keyword arguments,
// so a model that wants them takes `const deepspeed::ForwardKwargs&` as its forward's last
// parameter and ModuleEngine passes it (Engine::forward_kwargs() for other callers).
#pragma once

#include <cstdint>
#include <optional>

namespace deepspeed {

struct ForwardKwargs {
  /// curriculum_learning with curriculum_type "seqlen": the sequence length of this step, to
  /// which the model truncates its batch (DeepSpeed's `curriculum_seqlen`).
  std::optional<int64_t> curriculum_seqlen;
  /// progressive_layer_drop: the model drops layers stochastically with keep probability
  /// derived from pld_theta (DeepSpeed's `progressive_layer_drop`, `pld_theta`).
  bool progressive_layer_drop = false;
  double pld_theta = 1.0;

  /// Nothing to pass: evaluation, or neither feature enabled.
  bool empty() const { return !curriculum_seqlen && !progressive_layer_drop; }
};

}  // namespace deepspeed

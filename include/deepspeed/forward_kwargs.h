// What DeepSpeed's engine adds to the keyword arguments of a training forward: progressive layer
// drop's state, legacy curriculum learning's sequence length and random-LTD's schedule. C++ has
// no keyword arguments, so a model that wants them takes `const deepspeed::ForwardKwargs&` as
// its forward's last parameter and ModuleEngine passes it (Engine::forward_kwargs() for other
// callers).
#pragma once

#include <cstdint>
#include <optional>

namespace deepspeed {

class RandomLtdScheduler;

struct ForwardKwargs {
  /// curriculum_learning with curriculum_type "seqlen": the sequence length of this step, to
  /// which the model truncates its batch (DeepSpeed's `curriculum_seqlen`).
  std::optional<int64_t> curriculum_seqlen;
  /// progressive_layer_drop: the model drops layers stochastically with keep probability
  /// derived from pld_theta (DeepSpeed's `progressive_layer_drop`, `pld_theta`).
  bool progressive_layer_drop = false;
  double pld_theta = 1.0;
  /// data_efficiency.data_routing.random_ltd: the engine's schedule, updated for this step; the
  /// model runs its layers through a RandomLayerTokenDrop made from it (random_ltd.h). DeepSpeed
  /// hands it to the wrapped layers instead of passing a keyword.
  const RandomLtdScheduler* random_ltd = nullptr;

  /// Nothing to pass: evaluation, or none of the features enabled.
  bool empty() const {
    return !curriculum_seqlen && !progressive_layer_drop && random_ltd == nullptr;
  }
};

}  // namespace deepspeed

// RngState: the generator states a checkpointed forward consumed from, captured before it runs
// and restored around its recomputation in backward, so that dropout draws the same masks twice.
// Owns only the copies of the states; the generators stay LibTorch's defaults.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace deepspeed::checkpointing::detail {

/// The default CPU generator's state and, when CUDA is available at run time, the default
/// generator state of each visible CUDA device (DeepSpeed keeps the current device's; a block may
/// run on any of them). Compiles against CPU-only LibTorch: CUDA is reached through ATen's hooks.
struct RngState {
  at::Tensor cpu;
  std::vector<at::Tensor> cuda;  // index = device index; empty without CUDA

  /// The current states (copies; the generators keep running).
  static RngState capture();
  /// Makes the generators continue from these states.
  void restore() const;
};

/// Restores `saved` for its lifetime and puts back the states found at construction when it
/// ends (DeepSpeed's recompute: forward RNG in, backward RNG out), also when the body throws.
class RngStateSwap {
 public:
  explicit RngStateSwap(const RngState& saved) : outer_(RngState::capture()) { saved.restore(); }
  ~RngStateSwap() { outer_.restore(); }
  RngStateSwap(const RngStateSwap&) = delete;
  RngStateSwap& operator=(const RngStateSwap&) = delete;

 private:
  RngState outer_;
};

}  // namespace deepspeed::checkpointing::detail

// Activation checkpointing: DeepSpeed's deepspeed.checkpointing (checkpoint(function, args...)
// and configure(mpu, deepspeed_config, ...)). A checkpointed function runs without building a
// graph; its inputs are kept (on the host, or 1/mp of each across the model-parallel group) and
// it is run again in backward, with the RNG states of its forward, to get the gradients. Works
// for any code, pipeline or not. Not automatic: the engine does not call it (as in DeepSpeed);
// the model wraps its blocks. See docs/activation_checkpointing.md.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace deepspeed {

class Mpu;
struct DeepSpeedConfig;

namespace checkpointing {

/// The settings in force (DeepSpeed's module-level flags). Defaults are DeepSpeed's, used by
/// checkpoint() when configure() was never called.
struct Options {
  /// Keep only this rank's 1/mp slice of each checkpointed input (mp = the model-parallel group's
  /// size) and all-gather it in backward. Each such input's numel must divide by mp.
  bool partition_activations = false;
  /// Keep the checkpointed inputs (or their slices) in a separate host copy, pinned when CUDA is
  /// available, instead of referencing the caller's tensors; moved back to each input's device
  /// for the recomputation.
  bool cpu_checkpointing = false;
  /// Copy the partitions into per-input buffers of number_checkpoints slots allocated once
  /// (needs partition_activations and number_checkpoints); the buffers are dropped at the first
  /// backward, or by reset().
  bool contiguous_memory_optimization = false;
  /// Checkpoint calls between backwards (the slot count of the contiguous buffers).
  std::optional<int64_t> number_checkpoints;
  /// Synchronize the device at the start and end of each checkpointed forward and backward
  /// (torch::cuda::synchronize when CUDA is available; on CPU there is nothing in flight).
  bool synchronize_checkpoint_boundary = false;
  /// Log "time (ms) | fwd: ..." after each checkpointed forward and "time (ms) | backward: ..."
  /// after each recomputation and backward, on global rank 0.
  bool profile = false;
};

/// configure()'s explicit arguments; each one given overrides the config (DeepSpeed's names).
struct ConfigureOverrides {
  std::optional<bool> partition_activations;
  std::optional<bool> contiguous_checkpointing;
  std::optional<int64_t> num_checkpoints;
  std::optional<bool> checkpoint_in_cpu;
  std::optional<bool> synchronize;
  std::optional<bool> profile;
};

/// Sets the options: DeepSpeed's defaults, then `config`'s activation_checkpointing section when
/// given, then each override that is set. Takes the model-parallel group, rank and size from
/// `mpu` when given (kept until the next configure() with an mpu; without one ever, the
/// model-parallel size is 1). Throws ConfigError when contiguous_memory_optimization is on without
/// partition_activations or without number_checkpoints (DeepSpeed asserts both). Each
/// checkpoint() call reads the options once, so a backward uses the settings of its forward and a
/// configure() in between changes only later calls.
void configure(const Mpu* mpu, const DeepSpeedConfig* config = nullptr,
               const ConfigureOverrides& overrides = {});
/// Whether configure() was called (DeepSpeed's is_configured()).
bool is_configured();
/// The options in force.
Options options();
/// Drops the contiguous buffers (DeepSpeed's reset(): call after an evaluation whose forwards had
/// no backward). No-op without contiguous_memory_optimization.
void reset();

/// A checkpointable function: tensors in, tensors out.
using Function = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

/// Runs `function(inputs)` without recording a graph and returns its outputs, connected to
/// `inputs` and to the parameters `function` uses through one autograd node. In backward that
/// node restores the inputs (gathering partitions, moving host copies back), runs `function`
/// again with the CPU and CUDA generators in the states they had before the forward (then puts
/// the backward's states back), and back-propagates through the recomputed outputs; gradients
/// reach the inputs and accumulate into the parameters' .grad. Floating-point inputs are the
/// checkpointed activations; other inputs are kept as they are. Outputs that are not floating
/// point are non-differentiable.
///
/// `function` is copied and kept until the backward: capture what it uses by value.
/// The caller must not modify the inputs in place after the call (they are not copied unless
/// cpu_checkpointing or partition_activations), and `function` must be deterministic apart from
/// the RNG and must not keep state between calls. Parameters get gradients even when no input
/// requires grad (unlike DeepSpeed's reentrant checkpoint, which then gives them none). Use
/// backward() on the loss: torch::autograd::grad() with `inputs` does not reach through the
/// recomputation. With partition_activations the backward is collective over the
/// model-parallel group: every member must checkpoint and back-propagate the same calls in the
/// same order. Throws UsageError for an input that does not divide by the model-parallel size
/// under partition_activations, and for more calls than number_checkpoints between backwards
/// under contiguous_memory_optimization.
std::vector<at::Tensor> checkpoint(const Function& function, const std::vector<at::Tensor>& inputs);

/// The one-tensor form: `y = checkpoint([w](const at::Tensor& x) { return x.matmul(w); }, x)`.
/// For a module's forward use checkpoint_module().
at::Tensor checkpoint(const std::function<at::Tensor(const at::Tensor&)>& function,
                      const at::Tensor& input);

/// Checkpoints `module->forward(input)`: the form for a block of a model.
template <typename ModulePtr>
at::Tensor checkpoint_module(const ModulePtr& module, const at::Tensor& input) {
  return checkpoint([m = ModulePtr(module)](const at::Tensor& x) mutable { return m->forward(x); },
                    input);
}

/// Counters since the last reset_stats() (process-wide), for tests and reports.
struct Stats {
  int64_t forwards = 0;            // checkpointed forwards that will be recomputed
  int64_t recomputes = 0;          // recomputations in backward
  int64_t host_copies = 0;         // inputs (or slices) copied to the host (cpu_checkpointing)
  int64_t partitioned_inputs = 0;  // inputs kept as a 1/mp slice (partition_activations)
  int64_t gathered_inputs = 0;     // slices all-gathered back in backward
  int64_t contiguous_copies = 0;   // slices copied into a contiguous buffer slot
  int64_t synchronizations = 0;    // boundary synchronizations (2 per forward, 2 per backward)
  int64_t saved_bytes = 0;         // bytes of checkpointed inputs kept for backward now
  int64_t peak_saved_bytes = 0;    // the most held at once
};
Stats stats();
void reset_stats();

}  // namespace checkpointing
}  // namespace deepspeed

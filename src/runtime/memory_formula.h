// The engine's memory formula: bytes of model states per rank (parameters, fp32 master weights,
// gradients, optimizer states, reduction buffers) for a ZeRO stage, offload and precision, from
// the parameter count alone. Torch-free arithmetic, so that the engine's memory report (which
// prints it beside the measured ledger) and the autotuner (which prunes stages, offload and
// micro-batch sizes with it before running anything) share one formula. The table it encodes is
// in docs/zero.md ("Memory report") and docs/offload.md; tests/dist/memory_formula_dist_test.cpp
// holds it against the measured ledger.
#pragma once

#include <cstdint>
#include <string>

#include "deepspeed/config.h"

namespace deepspeed {

struct ModelStateInputs {
  int64_t num_params = 0;          // trainable parameters of the whole model (Ψ)
  int64_t dp_world_size = 1;       // ranks the states are partitioned over (W)
  int64_t stage = 0;               // ZeRO stage 0..3
  int64_t param_bytes = 4;         // bytes per model parameter: 4 fp32, 2 fp16/bf16
  int64_t optimizer_state_bytes_per_param = 8;  // Adam/AdamW: exp_avg + exp_avg_sq in fp32
  bool offload_optimizer = false;  // offload_optimizer cpu/nvme: masters + states leave the device
  bool offload_param = false;      // offload_param cpu/nvme (stage 3): parameter shards leave it
  int64_t reduce_bucket_size = 500000000;  // elements
  bool overlap_comm = false;       // two reduction buffers instead of one
  bool reduce_scatter = true;      // stage 3 on a GPU: a receive buffer beside each send buffer
  int64_t largest_param_numel = 0;  // stage 3: a gathered unit is at least this (0: unknown)
  /// torch_autocast: elements whose gradients travel in the autocast dtype (its
  /// lower_precision_safe_modules'), of low_precision_bytes each. ZeRO 1-3 keep a bucket pool
  /// per dtype, each as large as its own largest bucket.
  int64_t low_precision_numel = 0;
  int64_t low_precision_bytes = 2;
  /// ZeRO++ hpZ (stage 3): each parameter's secondary partition, 1/H of it, is kept from its
  /// forward to the step.
  int64_t hpz_partition_size = 1;
  /// bf16/fp16_master_weights_and_grads: the masters are the model's own 16-bit partitions
  /// (none apart on CPU; pinned 16-bit host copies with offload on a GPU).
  bool low_precision_masters = false;
  bool on_cpu = true;
};

/// Per-rank bytes by component, as the engine's ledger (MemoryStats) names them.
struct ModelStateBytes {
  int64_t params = 0;
  int64_t master_params = 0;
  int64_t grads = 0;
  int64_t optimizer_states = 0;
  int64_t reduction_buffers = 0;
  int64_t offloaded_optimizer = 0;  // part of master_params + optimizer_states kept in host memory
  int64_t offloaded_params = 0;     // part of params kept in host memory
  /// Held only during backward and step, on top of the steady state: stage 1 keeps full
  /// gradients in param.grad until the boundary; stage 3 gathers parameters per unit.
  int64_t transient = 0;
  /// Counted twice above, as the ledger counts them: stage 0's gradients are views of its
  /// reduction buckets.
  int64_t aliased = 0;
  /// On the training device at the steady state (the ledger's device_bytes()).
  int64_t device() const {
    return params + master_params + grads + optimizer_states + reduction_buffers -
           offloaded_optimizer - offloaded_params;
  }
  /// The device's high-water mark from model states: steady state plus the transient part.
  int64_t device_peak() const { return device() + transient; }
  /// Every byte of model states wherever it lives, at its high-water mark: what one process
  /// holds on a CPU-only machine, where "offloaded" states stay in the same memory.
  int64_t total_peak() const {
    return params + master_params + grads + optimizer_states + reduction_buffers + transient - aliased;
  }
};

/// The formula (docs/zero.md): with Ψ parameters, W ranks, b bytes per parameter, k optimizer
/// bytes per element and B = min(reduce_bucket_size, Ψ) (the largest bucket when bucket sizes
/// are filled exactly; a parameter larger than the bucket size makes a larger one):
///   stage 0: params bΨ, grads bΨ, states kΨ, masters 4Ψ if b < 4, buckets bΨ (every gradient);
///   stage 1: params bΨ, grads gΨ/W (+ bΨ transient in param.grad), states kΨ/W, masters 4Ψ/W,
///            buckets bB (2bB with overlap_comm);
///   stage 2: the same without the transient;
///   stage 3: params bΨ/W (+ gathered units transient), grads gΨ/W, states kΨ/W, masters 4Ψ/W,
///            buckets b(B + B/W with reduce_scatter), twice with overlap_comm;
/// with torch_autocast's L low-precision elements (l bytes), ZeRO 1-3's buckets are two pools:
/// b·min(B, Ψ-L) and l·min(B, L) (each with its B/W receive part at stage 3);
/// g = 4 (fp32 gradient partitions) with fp16/bf16, else b.
/// Offload moves the states (and masters) or the parameter shards to host memory.
ModelStateBytes estimate_model_state_bytes(const ModelStateInputs& in);

/// The inputs for a parsed config: its stage, precision, optimizer (Adam/AdamW/Lamb 8 bytes of
/// state per element, Lion/Adagrad/SGD 4, none 0), offload, bucket size and overlap_comm.
/// `on_cpu`: the model trains on CPU, where stage 3 reduces by all-reduce (Gloo has no
/// reduce-scatter) and so has no receive buffers.
ModelStateInputs model_state_inputs(const DeepSpeedConfig& config, int64_t num_params,
                                    int64_t largest_param_numel, bool on_cpu);

/// One line for logs: "ZeRO-2, W=2, Ψ=1.2M: device 12.34 MB (params ..., peak 14.00 MB)".
std::string describe_model_state_bytes(const ModelStateInputs& in, const ModelStateBytes& b);

}  // namespace deepspeed

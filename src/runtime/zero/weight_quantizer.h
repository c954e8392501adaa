// ZeRO++'s qwZ quantizer (zero_optimization.zero_quantized_weights): blockwise symmetric int8,
// DeepSpeed's CUDAQuantizer with 8 bits and its Symmetric type, for the shards a ZeRO-3 gather
// carries (Note [Quantized gather] in stage3_param.h).
//
// Note [Blockwise int8]: a flat tensor of n elements is cut into G groups of g elements each
// (the last padded with zeros). Group k keeps one float, its step s_k = 1 / (128 / max_k),
// max_k being the largest magnitude in the group (a group of zeros keeps 1), and each value x
// becomes q = clamp(round_half_even(x * 128 / max_k), -128, 127), read back as q * s_k. So a
// value is off by at most half a step, max_k / 256 (0.4 % of its group's largest), except a
// positive largest one, clamped to 127 steps, which loses a whole step; all for 1 byte per
// element plus 4 per group instead of 2 or 4 per element.
//
// The groups follow DeepSpeed's target of at most 8,000 elements, a multiple of 8 each. Where
// DeepSpeed searches a group count that divides n (and fails for an n no multiple of 8 divides),
// this pads: every n works, and each rank's shards have the same n, hence the same layout.
// DeepSpeed's kernel also rounds the input to fp16 first (a bf16 or fp32 value above 65,504
// becomes infinite there); this quantizes the float value itself.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

/// Elements per quantization group for a tensor of `numel` elements (Note [Blockwise int8]).
int64_t quantization_group_numel(int64_t numel);

struct QuantizedBlocks {
  at::Tensor values;  // int8, G * g elements (the input's, then zeros)
  at::Tensor scales;  // float, G: each group's step
};

/// Quantizes a flat tensor (any floating dtype, on any device).
QuantizedBlocks quantize_blocks(const at::Tensor& flat);

/// Reads blocks back: `values` [R, G * g] and `scales` [R, G] (R tensors quantized alike,
/// e.g. one per rank) become [R, G * g] of `dtype`.
at::Tensor dequantize_blocks(const at::Tensor& values, const at::Tensor& scales,
                             at::ScalarType dtype);

}  // namespace deepspeed::runtime

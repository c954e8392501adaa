// ZeRO++'s blockwise symmetric quantizer (DeepSpeed's quantizer op with its Symmetric type):
// 8 bits for qwZ's weights (Note [Quantized gather] in stage3_param.h), 4 bits for qgZ's
// gradients (Note [Quantized reduction] in quantized_reduction.h).
//
// Note [Blockwise quantization]: a flat tensor of n elements is cut into G groups of g elements
// each (the last padded with zeros). With b bits and h = 2^(b-1) (128 for 8 bits, 8 for 4),
// group k keeps one float, its step s_k = 1 / (h / max_k), max_k being the largest magnitude
// in the group (a group of zeros keeps 1), and each value x becomes
// q = clamp(round_half_even(x * h / max_k), -h, h - 1), read back as q * s_k. So a value is off
// by at most half a step, max_k / 2h (0.4 % of its group's largest with 8 bits, 6 % with 4),
// except positive values within half a step of the largest: clamped to h - 1 steps, they lose
// up to a whole step. 4-bit values travel two to a byte, the even element in the low half.
//
// Groups hold at most `target_group_numel` elements (DeepSpeed's weight quantizer aims below
// 8,000), a multiple of 8 each. Where DeepSpeed searches a group count that divides n (and
// fails for an n no multiple of 8 divides), this pads: every n works, and tensors of the same n
// (every rank's shards of one gather) share one layout. DeepSpeed's kernels also round the
// input to fp16 first (a bf16 or fp32 value above 65,504 becomes infinite there); this
// quantizes the float value itself.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime {

/// qwZ's group target: DeepSpeed's CUDAQuantizer.target_group_size.
constexpr int64_t kWeightGroupNumel = 8000;

/// Elements per quantization group for a tensor of `numel` elements (Note [Blockwise
/// quantization]).
int64_t quantization_group_numel(int64_t numel, int64_t target_group_numel = kWeightGroupNumel);

struct QuantizedBlocks {
  at::Tensor values;  // int8: G * g values (8 bits) or G * g / 2 bytes of two values (4 bits)
  at::Tensor scales;  // float, G: each group's step
};

/// Quantizes a flat tensor (any floating dtype, on any device) to `bits` (8 or 4).
QuantizedBlocks quantize_blocks(const at::Tensor& flat, int bits = 8,
                                int64_t target_group_numel = kWeightGroupNumel);

/// Reads blocks back: `values` [R, bytes] and `scales` [R, G] (R tensors quantized alike, e.g.
/// one per rank) become [R, G * g] of `dtype`.
at::Tensor dequantize_blocks(const at::Tensor& values, const at::Tensor& scales,
                             at::ScalarType dtype, int bits = 8);

}  // namespace deepspeed::runtime

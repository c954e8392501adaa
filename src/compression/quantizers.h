// DeepSpeed Compression's quantizers and top-k binarizer (compression/utils.py), each with its
// straight-through gradient: the forward returns the quantized tensor (mask), the backward
// passes the gradient through unchanged. Same operations in the same order as DeepSpeed's, so
// that results agree bit for bit on the same LibTorch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

namespace deepspeed::compression {

/// Static range for activation quantization (QuantAct's running min and max); nullopt: the
/// range of each group is taken from the tensor itself.
struct StaticRange {
  at::Tensor min, max;  // 0-d
};

/// SymQuantizer: round(x / s) clamped to [-2^(b-1), 2^(b-1) - 1], times s = 2 max|x| / 2^b,
/// per group of `num_groups` equal rows of the flattened tensor.
at::Tensor quantize_symmetric(const at::Tensor& x, int64_t bits, int64_t num_groups,
                              const std::optional<StaticRange>& range = std::nullopt);
/// AsymQuantizer: s = (max - min) / 2^b, zero point round(min / s) s, values in [0, 2^b - 1].
at::Tensor quantize_asymmetric(const at::Tensor& x, int64_t bits, int64_t num_groups,
                               const std::optional<StaticRange>& range = std::nullopt);
/// TernaryQuantizer: {-a, 0, a} per group, threshold 0.7 mean|x|.
at::Tensor quantize_ternary(const at::Tensor& x, int64_t num_groups);
/// BinaryQuantizer: sign(x) mean|x| per group.
at::Tensor quantize_binary(const at::Tensor& x, int64_t num_groups);

/// Weight quantization in the forward (the quantizer enable_weight_quantization picks): 3 bits
/// or more symmetric or asymmetric, 2 ternary, 1 binary. `type`: "symmetric" | "asymmetric".
at::Tensor quantize_weight(const at::Tensor& w, int64_t bits, const std::string& type,
                           int64_t num_groups);

/// `quantized` computed from `x` outside autograd, returned with x's gradient passing
/// straight through (DeepSpeed's quantizers' backward).
at::Tensor straight_through(const at::Tensor& x, const at::Tensor& quantized);

/// TopKBinarizer: 1 where `scores` is among the ceil(ratio * numel) largest, else 0, with the
/// gradient passed straight through to `scores`.
at::Tensor topk_binarize(const at::Tensor& scores, double ratio);

}  // namespace deepspeed::compression

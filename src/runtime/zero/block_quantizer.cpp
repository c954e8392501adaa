// Blockwise symmetric quantization (Note [Blockwise quantization]).
#include "runtime/zero/block_quantizer.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

constexpr int64_t kGroupMultiple = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check_bits(int bits) {
  DS_INTERNAL_ASSERT(bits == 8 || bits == 4, "the block quantizer takes 8 or 4 bits");
}

// 4 bits: q0 + 16 * q1 in one byte for each pair (q0 & 15 is the low half; the sum stays in
// [-128, 127] since q1 is in [-8, 7]).
at::Tensor pack_nibbles(const at::Tensor& q) {
  const at::Tensor pairs = q.to(at::kShort).view({-1, 2});
  return pairs.select(1, 0).bitwise_and(15).add(pairs.select(1, 1).mul(16)).to(at::kChar);
}

// [R, bytes] -> [R, 2 * bytes] in [-8, 7].
at::Tensor unpack_nibbles(const at::Tensor& packed) {
  const at::Tensor b = packed.to(at::kShort);
  const at::Tensor low = b.bitwise_and(15);
  const at::Tensor high = b.sub(low).div(16, "floor");
  const at::Tensor signed_low = low.sub(low.ge(8).to(at::kShort).mul(16));
  return at::stack({signed_low, high}, -1).view({packed.size(0), -1});
}

}  // namespace

int64_t quantization_group_numel(int64_t numel, int64_t target_group_numel) {
  const int64_t n = std::max<int64_t>(numel, 1);
  const int64_t groups = ceil_div(n, target_group_numel);
  return ceil_div(ceil_div(n, groups), kGroupMultiple) * kGroupMultiple;
}

QuantizedBlocks quantize_blocks(const at::Tensor& flat, int bits, int64_t target_group_numel) {
  DS_INTERNAL_ASSERT(flat.dim() == 1, "quantize_blocks takes a flat tensor");
  check_bits(bits);
  at::NoGradGuard no_grad;
  const int64_t n = flat.numel();
  const int64_t g = quantization_group_numel(n, target_group_numel);
  const int64_t groups = std::max<int64_t>(ceil_div(n, g), 1);
  const double half_range = bits == 8 ? 128.0 : 8.0;
  at::Tensor x = at::zeros({groups * g}, flat.options().dtype(at::kFloat));
  x.narrow(0, 0, n).copy_(flat);
  at::Tensor blocks = x.view({groups, g});
  const at::Tensor max = blocks.abs().amax(1, /*keepdim=*/true);
  // h / max, as a division (a reciprocal times h would round differently); 1 for zeros.
  at::Tensor scale = at::full_like(max, half_range).div_(max);
  scale.masked_fill_(max.eq(0), 1.0);
  QuantizedBlocks out;
  out.values = blocks.mul(scale).round_().clamp_(-half_range, half_range - 1).to(at::kChar);
  out.values = bits == 8 ? out.values.view({-1}) : pack_nibbles(out.values.view({-1}));
  out.scales = at::ones_like(scale).div_(scale).view({-1});
  return out;
}

at::Tensor dequantize_blocks(const at::Tensor& values, const at::Tensor& scales,
                             at::ScalarType dtype, int bits) {
  DS_INTERNAL_ASSERT(values.dim() == 2 && scales.dim() == 2 && values.size(0) == scales.size(0),
                     "dequantize_blocks takes [R, bytes] values and [R, G] scales");
  check_bits(bits);
  at::NoGradGuard no_grad;
  const int64_t rows = values.size(0);
  const int64_t groups = scales.size(1);
  const at::Tensor q = bits == 8 ? values : unpack_nibbles(values);
  DS_INTERNAL_ASSERT(groups > 0 && q.size(1) % groups == 0,
                     "quantized values do not split into their scales' groups");
  at::Tensor x = q.to(at::kFloat).view({rows, groups, -1});
  x.mul_(scales.to(at::kFloat).view({rows, groups, 1}));
  return x.view({rows, -1}).to(dtype);
}

}  // namespace deepspeed::runtime

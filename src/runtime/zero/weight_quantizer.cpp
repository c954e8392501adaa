// Blockwise int8 quantization (Note [Blockwise int8]).
#include "runtime/zero/weight_quantizer.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {
namespace {

constexpr int64_t kTargetGroupNumel = 8000;  // DeepSpeed's CUDAQuantizer.target_group_size
constexpr int64_t kGroupMultiple = 8;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

int64_t quantization_group_numel(int64_t numel) {
  const int64_t n = std::max<int64_t>(numel, 1);
  const int64_t groups = ceil_div(n, kTargetGroupNumel);
  return ceil_div(ceil_div(n, groups), kGroupMultiple) * kGroupMultiple;
}

QuantizedBlocks quantize_blocks(const at::Tensor& flat) {
  DS_INTERNAL_ASSERT(flat.dim() == 1, "quantize_blocks takes a flat tensor");
  at::NoGradGuard no_grad;
  const int64_t n = flat.numel();
  const int64_t g = quantization_group_numel(n);
  const int64_t groups = std::max<int64_t>(ceil_div(n, g), 1);
  at::Tensor x = at::zeros({groups * g}, flat.options().dtype(at::kFloat));
  x.narrow(0, 0, n).copy_(flat);
  at::Tensor blocks = x.view({groups, g});
  const at::Tensor max = blocks.abs().amax(1, /*keepdim=*/true);
  // 128 / max, as a division (a reciprocal times 128 would round differently); 1 for zeros.
  at::Tensor scale = at::full_like(max, 128.0).div_(max);
  scale.masked_fill_(max.eq(0), 1.0);
  QuantizedBlocks out;
  out.values = blocks.mul(scale).round_().clamp_(-128, 127).to(at::kChar).view({-1});
  out.scales = at::ones_like(scale).div_(scale).view({-1});
  return out;
}

at::Tensor dequantize_blocks(const at::Tensor& values, const at::Tensor& scales,
                             at::ScalarType dtype) {
  DS_INTERNAL_ASSERT(values.dim() == 2 && scales.dim() == 2 && values.size(0) == scales.size(0),
                     "dequantize_blocks takes [R, G * g] values and [R, G] scales");
  at::NoGradGuard no_grad;
  const int64_t rows = values.size(0);
  const int64_t groups = scales.size(1);
  DS_INTERNAL_ASSERT(groups > 0 && values.size(1) % groups == 0,
                     "quantized values do not split into their scales' groups");
  at::Tensor x = values.to(at::kFloat).view({rows, groups, -1});
  x.mul_(scales.to(at::kFloat).view({rows, groups, 1}));
  return x.view({rows, -1}).to(dtype);
}

}  // namespace deepspeed::runtime

// fused_adam(): CPU-Adam's update (ops/cpu_adam) as one multi-tensor kernel per 48 tensors, with
// the optional bf16/fp16 copy-out in the same pass. See Note [Chunks and batches].
#include <cstdint>

#include <cuda_runtime.h>

#include "ops/cpu_adam/kernel.h"  // AdamCoeffs, make_adam_coeffs: the CPU path's scalars
#include "ops/cuda_optim/cuda_optim.h"
#include "ops/cuda_optim/half_bits.cuh"
#include "ops/cuda_optim/launch_check.h"
#include "ops/cuda_optim/multi_tensor.cuh"
#include "ops/cuda_optim/tensor_list_check.cuh"
#include "util/check.h"

namespace deepspeed::ops::cuda_detail {
namespace {

using ops::detail::AdamCoeffs;
using ops::detail::DecayMode;

// The kernel's record of one tensor.
struct AdamRecord {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  uint16_t* half_copy;  // null: no copy of this tensor
  int64_t n;
  bool vectorized;  // every buffer aligned for float4 (half_copy for 4 x uint16_t)
};
using AdamBatch = TensorBatch<AdamRecord>;

// One element, in the operation order of Note [Identical arithmetic on every path]
// (cpu_adam/kernel.h). The _rn intrinsics are never contracted or reordered by nvcc, so each
// step rounds exactly once, as on the CPU; __fsqrt_rn and __fdiv_rn are IEEE-exact.
template <DecayMode kDecay>
__device__ __forceinline__ void adam_element(const AdamCoeffs& c, float& p, float g, float& m,
                                             float& v) {
  g = __fmul_rn(g, c.grad_scale);  // the unscale/clip coefficient; g * 1 is g
  if constexpr (kDecay == DecayMode::kL2) g = __fmaf_rn(p, c.decay, g);
  m = __fmaf_rn(g, c.one_minus_beta1, __fmul_rn(m, c.beta1));
  v = __fmaf_rn(__fmul_rn(g, g), c.one_minus_beta2, __fmul_rn(v, c.beta2));
  const float denom = __fmaf_rn(__fsqrt_rn(v), c.bias_correction2_inv_sqrt, c.eps);
  if constexpr (kDecay == DecayMode::kDecoupled) p = __fmaf_rn(p, c.decay, p);
  p = __fmaf_rn(__fdiv_rn(m, denom), c.step_size, p);
}

template <HalfKind kHalf>
__device__ __forceinline__ uint16_t half_bits(float x) {
  if constexpr (kHalf == HalfKind::kBF16) {
    return bf16_bits(x);
  } else {
    return fp16_bits(x);
  }
}

template <DecayMode kDecay, HalfKind kHalf>
__global__ void __launch_bounds__(kBlockThreads)
    fused_adam_kernel(const AdamBatch batch, const AdamCoeffs c) {
  for (int64_t chunk = blockIdx.x; chunk < batch.total_chunks; chunk += gridDim.x) {
    const int owner = owner_of(batch, chunk);
    const AdamRecord& t = batch.tensors[owner];
    const ChunkRange r = chunk_range(batch, owner, chunk);
    float* param = t.param + r.begin;
    const float* grad = t.grad + r.begin;
    float* exp_avg = t.exp_avg + r.begin;
    float* exp_avg_sq = t.exp_avg_sq + r.begin;
    uint16_t* half = (kHalf != HalfKind::kNone && t.half_copy != nullptr) ? t.half_copy + r.begin
                                                                           : nullptr;
    int64_t done = 0;
    if (t.vectorized) {
      const int64_t vectors = r.len / 4;
      for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        float4 p = reinterpret_cast<const float4*>(param)[i];
        const float4 g = reinterpret_cast<const float4*>(grad)[i];
        float4 m = reinterpret_cast<const float4*>(exp_avg)[i];
        float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[i];
        adam_element<kDecay>(c, p.x, g.x, m.x, v.x);
        adam_element<kDecay>(c, p.y, g.y, m.y, v.y);
        adam_element<kDecay>(c, p.z, g.z, m.z, v.z);
        adam_element<kDecay>(c, p.w, g.w, m.w, v.w);
        reinterpret_cast<float4*>(param)[i] = p;
        reinterpret_cast<float4*>(exp_avg)[i] = m;
        reinterpret_cast<float4*>(exp_avg_sq)[i] = v;
        if constexpr (kHalf != HalfKind::kNone) {
          if (half != nullptr) {
            // Little-endian: the lower address holds the low 16 bits.
            uint2 out;
            out.x = half_bits<kHalf>(p.x) | (uint32_t{half_bits<kHalf>(p.y)} << 16);
            out.y = half_bits<kHalf>(p.z) | (uint32_t{half_bits<kHalf>(p.w)} << 16);
            reinterpret_cast<uint2*>(half)[i] = out;
          }
        }
      }
      done = vectors * 4;
    }
    // The unaligned tensors, and the last (< 4) elements of an aligned one.
    for (int64_t i = done + threadIdx.x; i < r.len; i += blockDim.x) {
      float p = param[i];
      float m = exp_avg[i];
      float v = exp_avg_sq[i];
      adam_element<kDecay>(c, p, grad[i], m, v);
      param[i] = p;
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
      if constexpr (kHalf != HalfKind::kNone) {
        if (half != nullptr) half[i] = half_bits<kHalf>(p);
      }
    }
  }
}

template <DecayMode kDecay>
void launch_with_decay(HalfKind half_kind, const AdamBatch& batch, const AdamCoeffs& c,
                       cudaStream_t stream) {
  const unsigned grid = grid_blocks(batch.total_chunks);
  switch (half_kind) {
    case HalfKind::kBF16:
      fused_adam_kernel<kDecay, HalfKind::kBF16><<<grid, kBlockThreads, 0, stream>>>(batch, c);
      return;
    case HalfKind::kFP16:
      fused_adam_kernel<kDecay, HalfKind::kFP16><<<grid, kBlockThreads, 0, stream>>>(batch, c);
      return;
    case HalfKind::kNone:
      break;
  }
  fused_adam_kernel<kDecay, HalfKind::kNone><<<grid, kBlockThreads, 0, stream>>>(batch, c);
}

void launch(const AdamBatch& batch, const AdamCoeffs& c, HalfKind half_kind,
            cudaStream_t stream) {
  switch (c.decay_mode) {
    case DecayMode::kL2:
      launch_with_decay<DecayMode::kL2>(half_kind, batch, c, stream);
      break;
    case DecayMode::kDecoupled:
      launch_with_decay<DecayMode::kDecoupled>(half_kind, batch, c, stream);
      break;
    case DecayMode::kNone:
      launch_with_decay<DecayMode::kNone>(half_kind, batch, c, stream);
      break;
  }
  check_launch("fused_adam_kernel");
}

void check_arguments(const AdamStep& step, const AdamTensor* tensors, int count,
                     HalfKind half_kind) {
  check_tensor_list("fused_adam", step, tensors, count);
  DS_CHECK(half_kind == HalfKind::kNone || half_kind == HalfKind::kBF16 ||
               half_kind == HalfKind::kFP16,
           UsageError, "fused_adam: unknown HalfKind ", static_cast<int>(half_kind));
}

}  // namespace
}  // namespace deepspeed::ops::cuda_detail

namespace deepspeed::ops {

void fused_adam(const AdamStep& step, const AdamTensor* tensors, int count, HalfKind half_kind,
                void* stream) {
  using namespace cuda_detail;
  check_arguments(step, tensors, count, half_kind);
  const ops::detail::AdamCoeffs coeffs = ops::detail::make_adam_coeffs(step);
  auto record = [&](int i) {
    const AdamTensor& t = tensors[i];
    AdamRecord r{};
    r.param = t.param;
    r.grad = t.grad;
    r.exp_avg = t.exp_avg;
    r.exp_avg_sq = t.exp_avg_sq;
    r.half_copy = half_kind == HalfKind::kNone ? nullptr : static_cast<uint16_t*>(t.half_copy);
    r.n = t.n;
    r.vectorized = aligned_to(t.param, 16) && aligned_to(t.grad, 16) &&
                   aligned_to(t.exp_avg, 16) && aligned_to(t.exp_avg_sq, 16) &&
                   aligned_to(r.half_copy, 8);
    return r;
  };
  for_each_batch<AdamRecord>(count, record, [&](const AdamBatch& batch) {
    if (batch.total_chunks > 0) {
      launch(batch, coeffs, half_kind, static_cast<cudaStream_t>(stream));
    }
  });
}

}  // namespace deepspeed::ops

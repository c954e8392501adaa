// fused_lamb(): FusedLamb (runtime/optim/lamb.cpp) as three launches per 48 tensors, with the
// trust ratio computed on the device. See Note [Chunks and batches] and cuda_optim.h.
//
// Note [LAMB without an update buffer]
// LAMB needs ||u|| of the whole tensor before any element of p may move, so the update u is
// needed twice. Phase 1 computes it, updates m and v, and keeps only the chunk's sums of p^2 and
// u^2; phase 2 recomputes u from the new m and v and the unchanged p. The same _rn operations on
// the same inputs give the same u bit for bit, and the memory traffic equals that of writing u to
// a scratch buffer and reading it back (10 fp32 accesses per element either way), without the
// buffer.
#include <cmath>
#include <cstdint>

#include <cuda_runtime.h>

#include "ops/cuda_optim/cuda_optim.h"
#include "ops/cuda_optim/launch_check.h"
#include "ops/cuda_optim/multi_tensor.cuh"
#include "ops/cuda_optim/tensor_list_check.cuh"
#include "util/check.h"

namespace deepspeed::ops::cuda_detail {
namespace {

// The step's constants, each computed in double and rounded once to fp32 as ATen rounds a double
// scalar applied to an fp32 tensor in lamb.cpp's tensor ops.
struct LambConsts {
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float eps;
  float weight_decay;
  float max_coeff;
  float min_coeff;
  float step_size;  // lr * sqrt(bc2) / bc1, or lr
  bool eps_inside_sqrt;
  bool decay;  // weight_decay != 0, as lamb.cpp tests it
};

LambConsts make_lamb_consts(const LambStep& s) {
  LambConsts c{};
  c.beta1 = static_cast<float>(s.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - s.beta1);
  c.beta2 = static_cast<float>(s.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - s.beta2);
  c.eps = static_cast<float>(s.eps);
  c.weight_decay = static_cast<float>(s.weight_decay);
  c.max_coeff = static_cast<float>(s.max_coeff);
  c.min_coeff = static_cast<float>(s.min_coeff);
  double step_size = s.lr;
  if (s.bias_correction) {
    const double bc1 = 1.0 - std::pow(s.beta1, static_cast<double>(s.step));
    const double bc2 = 1.0 - std::pow(s.beta2, static_cast<double>(s.step));
    step_size = s.lr * std::sqrt(bc2) / bc1;
  }
  c.step_size = static_cast<float>(step_size);
  c.eps_inside_sqrt = s.eps_inside_sqrt;
  c.decay = s.weight_decay != 0.0;
  return c;
}

struct LambRecord {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t n;
  bool vectorized;  // every buffer aligned for float4
};
using LambBatch = TensorBatch<LambRecord>;

// m.mul_(beta1).add_(g, 1 - beta1) and v.mul_(beta2).addcmul_(g, g, 1 - beta2), as ATen's fp32
// kernels evaluate them (a fused multiply-add for add's alpha; value * g * g, then the sum).
__device__ __forceinline__ void lamb_moments(const LambConsts& c, float g, float& m, float& v) {
  m = __fmaf_rn(g, c.one_minus_beta1, __fmul_rn(m, c.beta1));
  v = __fadd_rn(__fmul_rn(v, c.beta2), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
}

// u = m / denom (+ weight_decay * p), from the updated moments.
__device__ __forceinline__ float lamb_direction(const LambConsts& c, float p, float m, float v) {
  const float denom = c.eps_inside_sqrt ? __fsqrt_rn(__fadd_rn(v, c.eps))
                                        : __fadd_rn(__fsqrt_rn(v), c.eps);
  float u = __fdiv_rn(m, denom);
  if (c.decay) u = __fmaf_rn(p, c.weight_decay, u);
  return u;
}

// Sum over the block, in a fixed order (deterministic); the result is valid in thread 0. Every
// thread of the block must call it.
template <class T>
__device__ T block_sum(T x) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ T warp_sums[kWarps];
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, offset);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    x = lane < kWarps ? warp_sums[lane] : T(0);
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_down_sync(0xFFFFFFFFu, x, offset);
  }
  __syncthreads();  // warp_sums is written again by the next call
  return x;
}

// Phase 1: moments, and per chunk the sums of p^2 and u^2 into workspace[2 * global chunk + 0/1].
__global__ void __launch_bounds__(kBlockThreads)
    lamb_moments_kernel(const LambBatch batch, const LambConsts c, float* workspace) {
  for (int64_t chunk = blockIdx.x; chunk < batch.total_chunks; chunk += gridDim.x) {
    const int owner = owner_of(batch, chunk);
    const LambRecord& t = batch.tensors[owner];
    const ChunkRange r = chunk_range(batch, owner, chunk);
    const float* param = t.param + r.begin;
    const float* grad = t.grad + r.begin;
    float* exp_avg = t.exp_avg + r.begin;
    float* exp_avg_sq = t.exp_avg_sq + r.begin;
    float p_sq = 0.0f;
    float u_sq = 0.0f;
    auto element = [&](float p, float g, float& m, float& v) {
      lamb_moments(c, g, m, v);
      const float u = lamb_direction(c, p, m, v);
      p_sq = __fmaf_rn(p, p, p_sq);
      u_sq = __fmaf_rn(u, u, u_sq);
    };
    int64_t done = 0;
    if (t.vectorized) {
      const int64_t vectors = r.len / 4;
      for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        const float4 p = reinterpret_cast<const float4*>(param)[i];
        const float4 g = reinterpret_cast<const float4*>(grad)[i];
        float4 m = reinterpret_cast<const float4*>(exp_avg)[i];
        float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[i];
        element(p.x, g.x, m.x, v.x);
        element(p.y, g.y, m.y, v.y);
        element(p.z, g.z, m.z, v.z);
        element(p.w, g.w, m.w, v.w);
        reinterpret_cast<float4*>(exp_avg)[i] = m;
        reinterpret_cast<float4*>(exp_avg_sq)[i] = v;
      }
      done = vectors * 4;
    }
    for (int64_t i = done + threadIdx.x; i < r.len; i += blockDim.x) {
      float m = exp_avg[i];
      float v = exp_avg_sq[i];
      element(param[i], grad[i], m, v);
      exp_avg[i] = m;
      exp_avg_sq[i] = v;
    }
    p_sq = block_sum(p_sq);
    u_sq = block_sum(u_sq);
    if (threadIdx.x == 0) {
      float* sums = workspace + 2 * (batch.chunk_base + chunk);
      sums[0] = p_sq;
      sums[1] = u_sq;
    }
  }
}

// One block per tensor: its chunks' partial sums (in double, in chunk order) give ||p|| and ||u||,
// and the trust ratio as lamb.cpp forms it: clamped only when both norms are non-zero, else 1.
// A NaN norm gives a NaN ratio, which the comparisons let through as at::clamp does.
__global__ void __launch_bounds__(kBlockThreads)
    lamb_coeff_kernel(const LambBatch batch, const LambConsts c, const float* workspace,
                      float* coeffs) {
  const int i = blockIdx.x;
  const int64_t first = batch.chunk_base + batch.chunk_begin[i];
  const int64_t chunks = chunks_of(batch.tensors[i].n);
  double p_sq = 0.0;
  double u_sq = 0.0;
  for (int64_t k = threadIdx.x; k < chunks; k += blockDim.x) {
    p_sq += workspace[2 * (first + k)];
    u_sq += workspace[2 * (first + k) + 1];
  }
  p_sq = block_sum(p_sq);
  u_sq = block_sum(u_sq);
  if (threadIdx.x == 0) {
    const float p_norm = __fsqrt_rn(static_cast<float>(p_sq));
    const float u_norm = __fsqrt_rn(static_cast<float>(u_sq));
    float coeff = 1.0f;
    if (p_norm != 0.0f && u_norm != 0.0f) {
      coeff = __fdiv_rn(p_norm, u_norm);
      if (coeff < c.min_coeff) coeff = c.min_coeff;
      if (coeff > c.max_coeff) coeff = c.max_coeff;
    }
    coeffs[batch.index[i]] = coeff;
  }
}

// Phase 2: p -= u * (coeff * step_size), u recomputed (Note [LAMB without an update buffer]).
__global__ void __launch_bounds__(kBlockThreads)
    lamb_apply_kernel(const LambBatch batch, const LambConsts c, const float* coeffs) {
  for (int64_t chunk = blockIdx.x; chunk < batch.total_chunks; chunk += gridDim.x) {
    const int owner = owner_of(batch, chunk);
    const LambRecord& t = batch.tensors[owner];
    const ChunkRange r = chunk_range(batch, owner, chunk);
    float* param = t.param + r.begin;
    const float* exp_avg = t.exp_avg + r.begin;
    const float* exp_avg_sq = t.exp_avg_sq + r.begin;
    const float scale = __fmul_rn(coeffs[batch.index[owner]], c.step_size);
    auto apply = [&](float p, float m, float v) {
      return __fsub_rn(p, __fmul_rn(lamb_direction(c, p, m, v), scale));
    };
    int64_t done = 0;
    if (t.vectorized) {
      const int64_t vectors = r.len / 4;
      for (int64_t i = threadIdx.x; i < vectors; i += blockDim.x) {
        float4 p = reinterpret_cast<const float4*>(param)[i];
        const float4 m = reinterpret_cast<const float4*>(exp_avg)[i];
        const float4 v = reinterpret_cast<const float4*>(exp_avg_sq)[i];
        p.x = apply(p.x, m.x, v.x);
        p.y = apply(p.y, m.y, v.y);
        p.z = apply(p.z, m.z, v.z);
        p.w = apply(p.w, m.w, v.w);
        reinterpret_cast<float4*>(param)[i] = p;
      }
      done = vectors * 4;
    }
    for (int64_t i = done + threadIdx.x; i < r.len; i += blockDim.x) {
      param[i] = apply(param[i], exp_avg[i], exp_avg_sq[i]);
    }
  }
}

void check_arguments(const LambStep& step, const LambTensor* tensors, int count) {
  check_tensor_list("fused_lamb", step, tensors, count);
}

}  // namespace
}  // namespace deepspeed::ops::cuda_detail

namespace deepspeed::ops {

int64_t fused_lamb_workspace_numel(const LambTensor* tensors, int count) {
  DS_CHECK(count >= 0 && (count == 0 || tensors != nullptr), UsageError,
           "fused_lamb_workspace_numel: ", count, " tensors at ",
           static_cast<const void*>(tensors));
  int64_t chunks = 0;
  for (int i = 0; i < count; ++i) chunks += cuda_detail::chunks_of(tensors[i].n);
  return 2 * chunks;
}

void fused_lamb(const LambStep& step, const LambTensor* tensors, int count, float* workspace,
                float* coeffs, void* stream) {
  using namespace cuda_detail;
  check_arguments(step, tensors, count);
  if (count == 0) return;
  DS_CHECK(coeffs != nullptr, UsageError, "fused_lamb: coeffs is null; expected ", count,
           " floats of device memory");
  const int64_t workspace_numel = fused_lamb_workspace_numel(tensors, count);
  DS_CHECK(workspace_numel == 0 || workspace != nullptr, UsageError,
           "fused_lamb: workspace is null; expected ", workspace_numel,
           " floats of device memory (fused_lamb_workspace_numel)");
  const LambConsts consts = make_lamb_consts(step);
  const auto s = static_cast<cudaStream_t>(stream);
  auto record = [&](int i) {
    const LambTensor& t = tensors[i];
    LambRecord r{};
    r.param = t.param;
    r.grad = t.grad;
    r.exp_avg = t.exp_avg;
    r.exp_avg_sq = t.exp_avg_sq;
    r.n = t.n;
    r.vectorized = aligned_to(t.param, 16) && aligned_to(t.grad, 16) &&
                   aligned_to(t.exp_avg, 16) && aligned_to(t.exp_avg_sq, 16);
    return r;
  };
  for_each_batch<LambRecord>(count, record, [&](const LambBatch& batch) {
    const unsigned grid = grid_blocks(batch.total_chunks);
    if (grid > 0) {
      lamb_moments_kernel<<<grid, kBlockThreads, 0, s>>>(batch, consts, workspace);
      check_launch("lamb_moments_kernel");
    }
    // Also for a batch of empty tensors: their coefficient is 1.
    lamb_coeff_kernel<<<batch.count, kBlockThreads, 0, s>>>(batch, consts, workspace, coeffs);
    check_launch("lamb_coeff_kernel");
    if (grid > 0) {
      lamb_apply_kernel<<<grid, kBlockThreads, 0, s>>>(batch, consts, coeffs);
      check_launch("lamb_apply_kernel");
    }
  });
}

}  // namespace deepspeed::ops

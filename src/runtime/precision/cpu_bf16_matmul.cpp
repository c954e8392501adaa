#include "runtime/precision/cpu_bf16_matmul.h"

#include <algorithm>
#include <initializer_list>
#include <mutex>

#include <ATen/ATen.h>
#include <ATen/ops/addbmm_cpu_dispatch.h>
#include <ATen/ops/addmm_cpu_dispatch.h>
#include <ATen/ops/addmv_cpu_dispatch.h>
#include <ATen/ops/baddbmm_cpu_dispatch.h>
#include <ATen/ops/bmm_cpu_dispatch.h>
#include <ATen/ops/dot_cpu_dispatch.h>
#include <ATen/ops/mm_cpu_dispatch.h>
#include <ATen/ops/vdot_cpu_dispatch.h>
#include <torch/library.h>

#include "deepspeed/errors.h"
#include "util/check.h"
#include "util/env.h"
#include "util/torch_compat.h"

namespace deepspeed::runtime {
namespace {

bool all_bf16(std::initializer_list<const at::Tensor*> tensors) {
  for (const at::Tensor* t : tensors) {
    if (t->scalar_type() != at::kBFloat16) return false;
  }
  return true;
}

at::Tensor up(const at::Tensor& t) { return t.to(at::kFloat); }

// `out` given the value `r` (out= semantics: resized when its shape differs).
at::Tensor& assign(at::Tensor& out, const at::Tensor& r) {
  if (out.sizes() != r.sizes()) out.resize_(r.sizes());
  return out.copy_(r);
}

// Each kernel: bf16 operands as fp32 products of the upcast operands, rounded once; anything
// else to ATen's CPU kernel itself (at::cpu:: calls it without going through the dispatcher,
// so these never call themselves).

// The fp32 copies a 2-D product needs at a time, in elements (16 MiB). A vocabulary head's
// logits and their gradients ([tokens, vocab]) would otherwise each take a whole fp32 copy.
constexpr int64_t kBlockElements = int64_t{4} << 20;

// bf16 `mat1 @ mat2` (with `bias`: beta * bias + alpha * mat1 @ mat2) computed in fp32 and
// rounded once, in blocks of output rows or columns: whichever cuts the larger operand, which is
// then upcast a block at a time (the other one once).
at::Tensor blocked_product(const at::Tensor& mat1, const at::Tensor& mat2, const at::Tensor* bias,
                           const at::Scalar& beta, const at::Scalar& alpha) {
  auto product = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return bias ? at::cpu::addmm(up(c), a, b, beta, alpha) : at::cpu::mm(a, b);
  };
  const bool plain = mat1.dim() != 2 || mat2.dim() != 2;  // ATen's errors for the rest
  const int64_t m = plain ? 0 : mat1.size(0), k = plain ? 0 : mat1.size(1);
  const int64_t n = plain ? 0 : mat2.size(1);
  const bool by_rows = m * k >= k * n;
  const int64_t len = by_rows ? m : n;
  // A block of output rows takes [block, k] of mat1 and [block, n] of output in fp32; a block of
  // columns [k, block] of mat2 and [m, block] of output.
  const int64_t per_line = k + (by_rows ? n : m);
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, per_line));
  if (plain || block >= len || (bias && bias->dim() > 2)) {
    return product(up(mat1), up(mat2), bias ? *bias : at::Tensor()).to(at::kBFloat16);
  }
  const at::Tensor c = bias ? bias->expand({m, n}) : at::Tensor();
  const int dim = by_rows ? 0 : 1;
  const at::Tensor whole = by_rows ? up(mat2) : up(mat1);
  at::Tensor out = at::empty({m, n}, mat1.options());
  for (int64_t i = 0; i < len; i += block) {
    const int64_t l = std::min(block, len - i);
    const at::Tensor part = by_rows ? up(mat1.narrow(0, i, l)) : up(mat2.narrow(1, i, l));
    const at::Tensor c_part = bias ? c.narrow(dim, i, l) : at::Tensor();
    out.narrow(dim, i, l).copy_(by_rows ? product(part, whole, c_part)
                                        : product(whole, part, c_part));
  }
  return out;
}

at::Tensor kernel_mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (!all_bf16({&self, &mat2})) return at::cpu::mm(self, mat2);
  return blocked_product(self, mat2, nullptr, 1, 1);
}

at::Tensor& kernel_mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  if (!all_bf16({&self, &mat2, &out})) return at::cpu::mm_outf(self, mat2, out);
  return assign(out, kernel_mm(self, mat2));
}

// bf16 `batch1 @ batch2` (with `bias`: beta * bias + alpha * batch1 @ batch2) computed in fp32
// and rounded once, a block of batch entries at a time: attention's [heads * batch, T, T] scores
// would otherwise take whole fp32 copies. Each entry's product is computed alone either way.
at::Tensor blocked_batch_product(const at::Tensor& batch1, const at::Tensor& batch2,
                                 const at::Tensor* bias, const at::Scalar& beta,
                                 const at::Scalar& alpha) {
  auto product = [&](const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    return bias ? at::cpu::baddbmm(up(c), up(a), up(b), beta, alpha) : at::cpu::bmm(up(a), up(b));
  };
  const bool plain = batch1.dim() != 3 || batch2.dim() != 3;  // ATen's errors for the rest
  const int64_t batches = plain ? 0 : batch1.size(0);
  const int64_t n = plain ? 0 : batch1.size(1), k = plain ? 0 : batch1.size(2);
  const int64_t m = plain ? 0 : batch2.size(2);
  const int64_t per_entry = n * k + k * m + n * m;
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, per_entry));
  if (plain || block >= batches || batch2.size(0) != batches || (bias && bias->dim() > 3)) {
    return product(batch1, batch2, bias ? *bias : at::Tensor()).to(at::kBFloat16);
  }
  const at::Tensor c = bias ? bias->expand({batches, n, m}) : at::Tensor();
  at::Tensor out = at::empty({batches, n, m}, batch1.options());
  for (int64_t i = 0; i < batches; i += block) {
    const int64_t l = std::min(block, batches - i);
    out.narrow(0, i, l).copy_(product(batch1.narrow(0, i, l), batch2.narrow(0, i, l),
                                      bias ? c.narrow(0, i, l) : at::Tensor()));
  }
  return out;
}

at::Tensor kernel_bmm(const at::Tensor& self, const at::Tensor& mat2) {
  if (!all_bf16({&self, &mat2})) return at::cpu::bmm(self, mat2);
  return blocked_batch_product(self, mat2, nullptr, 1, 1);
}

at::Tensor& kernel_bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  if (!all_bf16({&self, &mat2, &out})) return at::cpu::bmm_outf(self, mat2, out);
  return assign(out, kernel_bmm(self, mat2));
}

at::Tensor kernel_addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                        const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &mat1, &mat2})) return at::cpu::addmm(self, mat1, mat2, beta, alpha);
  return blocked_product(mat1, mat2, &self, beta, alpha);
}

at::Tensor& kernel_addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                             const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  if (!all_bf16({&self, &mat1, &mat2, &out})) {
    return at::cpu::addmm_outf(self, mat1, mat2, beta, alpha, out);
  }
  return assign(out, kernel_addmm(self, mat1, mat2, beta, alpha));
}

at::Tensor& kernel_addmm_(at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                          const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &mat1, &mat2})) return at::cpu::addmm_(self, mat1, mat2, beta, alpha);
  return self.copy_(kernel_addmm(self, mat1, mat2, beta, alpha));
}

at::Tensor kernel_baddbmm(const at::Tensor& self, const at::Tensor& batch1,
                          const at::Tensor& batch2, const at::Scalar& beta,
                          const at::Scalar& alpha) {
  if (!all_bf16({&self, &batch1, &batch2})) {
    return at::cpu::baddbmm(self, batch1, batch2, beta, alpha);
  }
  return blocked_batch_product(batch1, batch2, &self, beta, alpha);
}

at::Tensor& kernel_baddbmm_out(const at::Tensor& self, const at::Tensor& batch1,
                               const at::Tensor& batch2, const at::Scalar& beta,
                               const at::Scalar& alpha, at::Tensor& out) {
  if (!all_bf16({&self, &batch1, &batch2, &out})) {
    return at::cpu::baddbmm_outf(self, batch1, batch2, beta, alpha, out);
  }
  return assign(out, kernel_baddbmm(self, batch1, batch2, beta, alpha));
}

at::Tensor& kernel_baddbmm_(at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                            const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &batch1, &batch2})) {
    return at::cpu::baddbmm_(self, batch1, batch2, beta, alpha);
  }
  return self.copy_(kernel_baddbmm(self, batch1, batch2, beta, alpha));
}

// bf16 `beta * self + alpha * sum_b batch1[b] @ batch2[b]`, summed in fp32 and rounded once.
// ATen's addbmm adds one entry's product at a time to its bf16 result with addmm_, which rounds
// once per batch entry. Here the fp32 sum takes the same order (entry by entry), a block of
// entries upcast at a time.
at::Tensor blocked_batch_sum(const at::Tensor& self, const at::Tensor& batch1,
                             const at::Tensor& batch2, const at::Scalar& beta,
                             const at::Scalar& alpha) {
  const bool plain = batch1.dim() != 3 || batch2.dim() != 3 || batch1.size(0) != batch2.size(0);
  const int64_t batches = plain ? 0 : batch1.size(0);
  const int64_t per_entry =
      plain ? 0 : batch1.size(1) * batch1.size(2) + batch2.size(1) * batch2.size(2);
  const int64_t block = std::max<int64_t>(1, kBlockElements / std::max<int64_t>(1, per_entry));
  if (plain || block >= batches) {  // ATen's errors and empty batches, too
    return at::cpu::addbmm(up(self), up(batch1), up(batch2), beta, alpha).to(at::kBFloat16);
  }
  at::Tensor sum = at::cpu::addbmm(up(self), up(batch1.narrow(0, 0, block)),
                                   up(batch2.narrow(0, 0, block)), beta, alpha);
  for (int64_t i = block; i < batches; i += block) {
    const int64_t l = std::min(block, batches - i);
    at::cpu::addbmm_(sum, up(batch1.narrow(0, i, l)), up(batch2.narrow(0, i, l)), 1, alpha);
  }
  return sum.to(at::kBFloat16);
}

at::Tensor kernel_addbmm(const at::Tensor& self, const at::Tensor& batch1,
                         const at::Tensor& batch2, const at::Scalar& beta,
                         const at::Scalar& alpha) {
  if (!all_bf16({&self, &batch1, &batch2})) {
    return at::cpu::addbmm(self, batch1, batch2, beta, alpha);
  }
  return blocked_batch_sum(self, batch1, batch2, beta, alpha);
}

at::Tensor& kernel_addbmm_out(const at::Tensor& self, const at::Tensor& batch1,
                              const at::Tensor& batch2, const at::Scalar& beta,
                              const at::Scalar& alpha, at::Tensor& out) {
  if (!all_bf16({&self, &batch1, &batch2, &out})) {
    return at::cpu::addbmm_outf(self, batch1, batch2, beta, alpha, out);
  }
  return assign(out, kernel_addbmm(self, batch1, batch2, beta, alpha));
}

at::Tensor& kernel_addbmm_(at::Tensor& self, const at::Tensor& batch1, const at::Tensor& batch2,
                           const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &batch1, &batch2})) {
    return at::cpu::addbmm_(self, batch1, batch2, beta, alpha);
  }
  return self.copy_(kernel_addbmm(self, batch1, batch2, beta, alpha));
}

// mv is addmv_ on an empty output with beta 0 (which ignores the output's values).
at::Tensor kernel_addmv(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                        const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &mat, &vec})) return at::cpu::addmv(self, mat, vec, beta, alpha);
  return at::cpu::addmv(up(self), up(mat), up(vec), beta, alpha).to(at::kBFloat16);
}

at::Tensor& kernel_addmv_out(const at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                             const at::Scalar& beta, const at::Scalar& alpha, at::Tensor& out) {
  if (!all_bf16({&self, &mat, &vec, &out})) {
    return at::cpu::addmv_outf(self, mat, vec, beta, alpha, out);
  }
  return assign(out, kernel_addmv(self, mat, vec, beta, alpha));
}

at::Tensor& kernel_addmv_(at::Tensor& self, const at::Tensor& mat, const at::Tensor& vec,
                          const at::Scalar& beta, const at::Scalar& alpha) {
  if (!all_bf16({&self, &mat, &vec})) return at::cpu::addmv_(self, mat, vec, beta, alpha);
  return self.copy_(kernel_addmv(self, mat, vec, beta, alpha));
}

at::Tensor kernel_dot(const at::Tensor& self, const at::Tensor& other) {
  if (!all_bf16({&self, &other})) return at::cpu::dot(self, other);
  return at::cpu::dot(up(self), up(other)).to(at::kBFloat16);
}

at::Tensor kernel_vdot(const at::Tensor& self, const at::Tensor& other) {
  if (!all_bf16({&self, &other})) return at::cpu::vdot(self, other);
  return at::cpu::vdot(up(self), up(other)).to(at::kBFloat16);
}

std::mutex& registration_mutex() {
  static std::mutex m;
  return m;
}

// The registration every live Fp32AccumulatingBf16Matmul of each scope shares.
std::weak_ptr<void>& current_registration(Bf16Products scope) {
  static std::weak_ptr<void> every, dots;
  return scope == Bf16Products::kEvery ? every : dots;
}

}  // namespace

struct Fp32AccumulatingBf16Matmul::Registration {
  explicit Registration(Bf16Products scope) {
    // The dispatcher warns that each kernel overrides ATen's, as intended here.
    compat::DroppingWarningHandler quiet;
    compat::WarningHandlerGuard guard(&quiet);
    library = std::make_unique<torch::Library>(torch::Library::IMPL, "aten", c10::DispatchKey::CPU,
                                               __FILE__, __LINE__);
    library->impl("dot", TORCH_FN(kernel_dot));  // dot.out and matmul of vectors call dot
    library->impl("vdot", TORCH_FN(kernel_vdot));
    if (scope == Bf16Products::kDots) return;
    library->impl("mm", TORCH_FN(kernel_mm));
    library->impl("mm.out", TORCH_FN(kernel_mm_out));
    library->impl("bmm", TORCH_FN(kernel_bmm));
    library->impl("bmm.out", TORCH_FN(kernel_bmm_out));
    library->impl("addmm", TORCH_FN(kernel_addmm));
    library->impl("addmm.out", TORCH_FN(kernel_addmm_out));
    library->impl("addmm_", TORCH_FN(kernel_addmm_));
    library->impl("baddbmm", TORCH_FN(kernel_baddbmm));
    library->impl("baddbmm.out", TORCH_FN(kernel_baddbmm_out));
    library->impl("baddbmm_", TORCH_FN(kernel_baddbmm_));
    library->impl("addbmm", TORCH_FN(kernel_addbmm));
    library->impl("addbmm.out", TORCH_FN(kernel_addbmm_out));
    library->impl("addbmm_", TORCH_FN(kernel_addbmm_));
    library->impl("addmv", TORCH_FN(kernel_addmv));  // mv and mv.out call addmv_ and addmv.out
    library->impl("addmv.out", TORCH_FN(kernel_addmv_out));
    library->impl("addmv_", TORCH_FN(kernel_addmv_));
  }
  std::unique_ptr<torch::Library> library;  // its destruction restores ATen's kernels
};

Fp32AccumulatingBf16Matmul::Fp32AccumulatingBf16Matmul(Bf16Products scope) {
  std::lock_guard<std::mutex> lock(registration_mutex());
  auto shared = std::static_pointer_cast<Registration>(current_registration(scope).lock());
  if (!shared) {
    shared = std::make_shared<Registration>(scope);
    current_registration(scope) = shared;
  }
  registration_ = std::move(shared);
}

Fp32AccumulatingBf16Matmul::~Fp32AccumulatingBf16Matmul() {
  std::lock_guard<std::mutex> lock(registration_mutex());
  registration_.reset();
}

bool Fp32AccumulatingBf16Matmul::active(Bf16Products scope) {
  std::lock_guard<std::mutex> lock(registration_mutex());
  return !current_registration(scope).expired();
}

bool cpu_bf16_gemm_accumulates_in_bf16() {
#if DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16 && (defined(__x86_64__) || defined(__i386__))
  // ATen 1.13's use_mkldnn_bf16_matmul: oneDNN built in and enabled, and AVX-512 BW/VL/DQ.
  const bool onednn = at::hasMKLDNN() && at::globalContext().userEnabledMkldnn() &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                      __builtin_cpu_supports("avx512dq");
  return !onednn;
#elif DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16
  return true;  // oneDNN's bf16 GEMM path in ATen 1.13 is x86's AVX-512 only
#else
  return false;
#endif
}

bool cpu_bf16_dot_accumulates_in_bf16() {
  // ATen 1.13's CPU dot sums bf16 products in bf16 whether or not oneDNN is there: a 4096-long
  // dot of normal values is off by ~19% (torch 2.x: 0.05%).
  return DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16 != 0;
}

std::string use_fp32_accumulating_bf16_matmul_where_needed() {
  const std::string mode = env::get("DS_CPU_BF16_MATMUL").value_or("auto");
  DS_CHECK(mode == "auto" || mode == "fp32" || mode == "native", ConfigError,
           "DS_CPU_BF16_MATMUL=", mode, ": expected auto, fp32 or native");
  // Tests take LibTorch's bf16-accumulating GEMM path on any CPU this way, as an AVX2-only one
  // would.
  if (env::get("DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN").value_or("0") == "1") {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  if (mode == "native") return "";
  const bool gemm = cpu_bf16_gemm_accumulates_in_bf16();
  if (mode == "auto" && !gemm) {
    if (!cpu_bf16_dot_accumulates_in_bf16()) return "";
    static const auto* dots = new Fp32AccumulatingBf16Matmul(Bf16Products::kDots);
    (void)dots;
    return "bf16 dot products (dot, vdot) are computed in fp32 and rounded to bf16: LibTorch's "
           "own dot sums them in bf16 (DS_CPU_BF16_MATMUL=native keeps it)";
  }
  // For the rest of the process: the engine's module may outlive the engine.
  static const auto* kept = new Fp32AccumulatingBf16Matmul(Bf16Products::kEvery);
  (void)kept;
  return gemm ? "bf16 matmuls on this CPU are computed as fp32 products rounded to bf16: "
                "LibTorch's own bf16 GEMM here accumulates in bf16 (no oneDNN path), which "
                "loses small updates (DS_CPU_BF16_MATMUL=native keeps it)"
              : "bf16 matmuls are computed as fp32 products rounded to bf16 "
                "(DS_CPU_BF16_MATMUL=fp32)";
}

}  // namespace deepspeed::runtime

// bf16 matrix products on CPUs where LibTorch 1.13 would accumulate them in bf16.
//
// ATen 1.13 multiplies bf16 matrices through oneDNN, which accumulates in fp32, only where
// oneDNN is enabled and the CPU has AVX-512 (BW, VL, DQ). Elsewhere (AVX2-only CPUs such as
// many AMD EPYCs) its fallback GEMM accumulates the products in bf16 itself: a 512x1024 by
// 1024x768 product is off by 3.7% (relative Frobenius; oneDNN 0.29%) and takes 25x as long as
// oneDNN's. bf16 training there loses its small updates (the tiny Llama's held-out loss rose over
// 5 steps). Torch 2.x accumulates in fp32 on every path, so this is a 1.x matter only.
//
// Its matrix-vector product (mv, addmv) does the same where the GEMM does; its dot products (dot,
// vdot) sum in bf16 on every CPU, oneDNN or not (a 4096-long dot is off by ~19%).
//
// The remedy: CPU kernels for mm, addmm, bmm, baddbmm, addbmm and addmv (functional, out= and
// in-place forms), dot and vdot that compute a bf16 product as fp32 products of the upcast
// operands, rounded once to bf16, and hand every other dtype to ATen's own CPU kernels. Registered over
// ATen's at runtime, they serve the module's forward and autograd's backward alike (linear,
// matmul, mv and einsum decompose into them), for any model, with no change to it.
#pragma once

#include <memory>
#include <string>

namespace deepspeed::runtime {

/// Whether ATen's CPU GEMM accumulates bf16 products in bf16 on this machine: a LibTorch 1.x
/// build whose bf16 matmul does not take oneDNN (not built in, disabled, or no AVX-512 BW/VL/DQ).
bool cpu_bf16_gemm_accumulates_in_bf16();

/// Whether ATen's CPU dot and vdot sum bf16 products in bf16: any LibTorch 1.x build.
bool cpu_bf16_dot_accumulates_in_bf16();

/// Which products the kernels take over: every one above, or dot and vdot only (where the
/// GEMM already accumulates in fp32).
enum class Bf16Products { kEvery, kDots };

/// Keeps the fp32-accumulating kernels of `scope` registered while alive; the last one of a
/// scope gone restores ATen's. Registration swaps the dispatcher's CPU kernels: make it before
/// training threads run.
class Fp32AccumulatingBf16Matmul {
 public:
  explicit Fp32AccumulatingBf16Matmul(Bf16Products scope = Bf16Products::kEvery);
  ~Fp32AccumulatingBf16Matmul();
  Fp32AccumulatingBf16Matmul(const Fp32AccumulatingBf16Matmul&) = delete;
  Fp32AccumulatingBf16Matmul& operator=(const Fp32AccumulatingBf16Matmul&) = delete;

  /// Whether any instance of `scope` is alive.
  static bool active(Bf16Products scope = Bf16Products::kEvery);

 private:
  struct Registration;
  std::shared_ptr<Registration> registration_;
};

/// What the engine does when it trains in bf16 on the CPU: registers the kernels for the rest of
/// the process, every product's where cpu_bf16_gemm_accumulates_in_bf16() and otherwise the dot
/// products' where cpu_bf16_dot_accumulates_in_bf16() (DS_CPU_BF16_MATMUL=auto, the default),
/// every product's always (fp32), or none (native; any other value is a ConfigError naming the
/// variable).
/// Returns a line for the log saying which, empty when there is nothing to say.
std::string use_fp32_accumulating_bf16_matmul_where_needed();

}  // namespace deepspeed::runtime

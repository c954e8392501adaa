// The fp32-accumulating bf16 matmul kernels: while registered, every bf16 product (mm, addmm, bmm,
// baddbmm, addbmm, addmv in their functional, out= and in-place forms, dot, vdot, and
// linear/matmul/mv and autograd's backward through them) equals the fp32 product of the upcast
// operands rounded once to bf16, bit for bit; other dtypes keep ATen's result bit for bit;
// unregistering restores ATen's kernels; the dots-only scope leaves the GEMMs to ATen.
// With oneDNN disabled, LibTorch 1.13 takes the GEMM that accumulates in bf16, as it does on
// AVX2-only CPUs, so these tests cover that machine's path here too.
#include "runtime/precision/cpu_bf16_matmul.h"

#include <cstdlib>

#include <ATen/ops/mm_cpu_dispatch.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/errors.h"
#include "util/torch_compat.h"

namespace deepspeed::runtime {
namespace {

// oneDNN off for the test's span: LibTorch 1.13 then takes its bf16-accumulating GEMM.
struct WithoutOneDnn {
  WithoutOneDnn() : was(at::globalContext().userEnabledMkldnn()) {
    at::globalContext().setUserEnabledMkldnn(false);
  }
  ~WithoutOneDnn() { at::globalContext().setUserEnabledMkldnn(was); }
  bool was;
};

at::Tensor bf16(at::IntArrayRef sizes, int seed) {
  torch::manual_seed(seed);
  return torch::randn(sizes).to(at::kBFloat16);
}

at::Tensor rounded(const at::Tensor& fp32) { return fp32.to(at::kBFloat16); }
at::Tensor f(const at::Tensor& t) { return t.to(at::kFloat); }

double relative_error(const at::Tensor& got, const at::Tensor& exact) {
  return (f(got) - exact).norm().item<double>() / exact.norm().item<double>();
}

TEST(CpuBf16Matmul, EveryFormIsTheFp32ProductRoundedOnce) {
  WithoutOneDnn no_onednn;
  Fp32AccumulatingBf16Matmul fp32_products;
  ASSERT_TRUE(Fp32AccumulatingBf16Matmul::active());
  const at::Tensor a = bf16({64, 256}, 1), b = bf16({256, 48}, 2), c = bf16({64, 48}, 3);
  const at::Tensor a3 = bf16({3, 16, 256}, 4), b3 = bf16({3, 256, 24}, 5),
                   c3 = bf16({3, 16, 24}, 6);
  const at::Tensor mm = rounded(f(a).mm(f(b)));
  EXPECT_TRUE(at::mm(a, b).equal(mm));
  EXPECT_TRUE(at::matmul(a, b).equal(mm));
  at::Tensor out = at::empty({0}, a.options());
  at::mm_out(out, a, b);
  EXPECT_TRUE(out.equal(mm));
  const at::Tensor addmm = rounded(at::addmm(f(c), f(a), f(b), 0.5, 2.0));
  EXPECT_TRUE(at::addmm(c, a, b, 0.5, 2.0).equal(addmm));
  at::addmm_out(out, c, a, b, 0.5, 2.0);
  EXPECT_TRUE(out.equal(addmm));
  EXPECT_TRUE(c.clone().addmm_(a, b, 0.5, 2.0).equal(addmm));
  // linear: x W^T + bias, through addmm.
  const at::Tensor w = b.t().contiguous(), bias = bf16({48}, 7);
  EXPECT_TRUE(at::linear(a, w, bias).equal(rounded(at::linear(f(a), f(w), f(bias)))));
  const at::Tensor bmm = rounded(f(a3).bmm(f(b3)));
  EXPECT_TRUE(at::bmm(a3, b3).equal(bmm));
  EXPECT_TRUE(at::matmul(a3, b3).equal(bmm));
  at::bmm_out(out, a3, b3);
  EXPECT_TRUE(out.equal(bmm));
  const at::Tensor baddbmm = rounded(at::baddbmm(f(c3), f(a3), f(b3), 0.25, 3.0));
  EXPECT_TRUE(at::baddbmm(c3, a3, b3, 0.25, 3.0).equal(baddbmm));
  at::baddbmm_out(out, c3, a3, b3, 0.25, 3.0);
  EXPECT_TRUE(out.equal(baddbmm));
  EXPECT_TRUE(c3.clone().baddbmm_(a3, b3, 0.25, 3.0).equal(baddbmm));
  // addbmm: the entries' products summed in fp32, rounded once (not once per entry).
  const at::Tensor addbmm = rounded(at::addbmm(f(c3[0]), f(a3), f(b3), 0.25, 3.0));
  EXPECT_TRUE(at::addbmm(c3[0], a3, b3, 0.25, 3.0).equal(addbmm));
  at::addbmm_out(out, c3[0], a3, b3, 0.25, 3.0);
  EXPECT_TRUE(out.equal(addbmm));
  EXPECT_TRUE(c3[0].clone().addbmm_(a3, b3, 0.25, 3.0).equal(addbmm));
  // Matrix-vector: mv and mv.out are addmv_ and addmv.out on ATen's side.
  const at::Tensor v = bf16({256}, 20), u = bf16({64}, 21);
  const at::Tensor mv = rounded(f(a).mv(f(v)));
  EXPECT_TRUE(at::mv(a, v).equal(mv));
  EXPECT_TRUE(at::matmul(a, v).equal(mv));
  at::mv_out(out, a, v);
  EXPECT_TRUE(out.equal(mv));
  const at::Tensor addmv = rounded(at::addmv(f(u), f(a), f(v), 0.5, 2.0));
  EXPECT_TRUE(at::addmv(u, a, v, 0.5, 2.0).equal(addmv));
  at::addmv_out(out, u, a, v, 0.5, 2.0);
  EXPECT_TRUE(out.equal(addmv));
  EXPECT_TRUE(u.clone().addmv_(a, v, 0.5, 2.0).equal(addmv));
  // Dots: dot.out and matmul of two vectors call dot.
  const at::Tensor w2 = bf16({256}, 22);
  const at::Tensor dot = rounded(f(v).dot(f(w2)));
  EXPECT_TRUE(at::dot(v, w2).equal(dot));
  EXPECT_TRUE(at::vdot(v, w2).equal(dot));
  EXPECT_TRUE(at::matmul(v, w2).equal(dot));
  at::Tensor scalar_out = at::empty({}, v.options());
  at::dot_out(scalar_out, v, w2);
  EXPECT_TRUE(scalar_out.equal(dot));
}

// A blocked 2-D product against the whole one: OpenBLAS's fp32 sum for an output element
// depends on the product's row count on some kernels (Haswell's, which AVX2-only CPUs take: a
// few elements per million move by an fp32 ulp; SkylakeX's do not), so an element may round to
// the neighbouring bf16 value. Every element within one bf16 ulp of the exact fp32 product, and
// all but a handful its rounding; a bf16-accumulating product is off by far more.
void expect_blocked_product(const at::Tensor& got, const at::Tensor& exact) {
  const at::Tensor want = rounded(exact);
  EXPECT_LT(got.ne(want).sum().item<double>() / static_cast<double>(want.numel()), 1e-4);
  const at::Tensor err = (f(got) - exact).abs();
  EXPECT_TRUE(err.le(exact.abs() / 128 + 1e-4).all().item<bool>()) << err.max();
}

// A product whose fp32 copies would exceed 16 MiB is computed in blocks of output rows (the
// larger operand the left one) or columns (the right one), a block of that operand upcast at a
// time, and a batched one in blocks of batch entries: the same values, bias included (2-D: to
// the BLAS's dependence on the row count, above; batched: bit for bit, each entry is its own
// product either way).
TEST(CpuBf16Matmul, LargeProductsAreComputedInBlocks) {
  WithoutOneDnn no_onednn;
  Fp32AccumulatingBf16Matmul fp32_products;
  const at::Tensor tall = bf16({4096, 64}, 13), wide = bf16({64, 2048}, 14);
  const at::Tensor bias = bf16({2048}, 15), rows_bias = bf16({4096, 1}, 16);
  expect_blocked_product(at::mm(tall, wide), f(tall).mm(f(wide)));
  expect_blocked_product(at::addmm(bias, tall, wide, 0.5, 2.0),
                         at::addmm(f(bias), f(tall), f(wide), 0.5, 2.0));
  const at::Tensor left = bf16({2048, 64}, 17), right = bf16({64, 4096}, 18);
  expect_blocked_product(at::mm(left, right), f(left).mm(f(right)));
  const at::Tensor left_bias = bf16({2048, 1}, 19);
  expect_blocked_product(at::addmm(left_bias, left, right),
                         at::addmm(f(left_bias), f(left), f(right)));
  // Transposed operands, as autograd passes them.
  expect_blocked_product(at::mm(right.t(), left.t()), f(right).t().mm(f(left).t()));
  expect_blocked_product(at::addmm(rows_bias, tall, wide),
                         at::addmm(f(rows_bias), f(tall), f(wide)));
  // Batched products in blocks of batch entries (21 of these at a time: 21, 21, 6), biases
  // broadcast over the batch or per entry.
  const at::Tensor b1 = bf16({48, 256, 256}, 31), b2 = bf16({48, 256, 256}, 32);
  EXPECT_TRUE(at::bmm(b1, b2).equal(rounded(f(b1).bmm(f(b2)))));
  EXPECT_TRUE(at::matmul(b1, b2.transpose(1, 2)).equal(rounded(f(b1).bmm(f(b2).transpose(1, 2)))));
  const at::Tensor shared_bias = bf16({256, 256}, 33), entry_bias = bf16({48, 1, 256}, 34);
  EXPECT_TRUE(at::baddbmm(shared_bias, b1, b2, 0.5, 2.0)
                  .equal(rounded(at::baddbmm(f(shared_bias), f(b1), f(b2), 0.5, 2.0))));
  EXPECT_TRUE(at::baddbmm(entry_bias, b1, b2).equal(
      rounded(at::baddbmm(f(entry_bias), f(b1), f(b2)))));
  // addbmm's sum over the entries, a block at a time, in ATen's fp32 order: bit for bit.
  EXPECT_TRUE(at::addbmm(shared_bias, b1, b2, 0.5, 2.0)
                  .equal(rounded(at::addbmm(f(shared_bias), f(b1), f(b2), 0.5, 2.0))));
}

// Autograd's backward of a bf16 linear goes through the same kernels: each gradient is the
// fp32 product rounded once.
TEST(CpuBf16Matmul, BackwardTakesTheSameKernels) {
  WithoutOneDnn no_onednn;
  Fp32AccumulatingBf16Matmul fp32_products;
  const at::Tensor x = bf16({32, 512}, 8).requires_grad_(true);
  const at::Tensor w = bf16({40, 512}, 9).requires_grad_(true);
  const at::Tensor g = bf16({32, 40}, 10);
  at::linear(x, w).backward(g);
  EXPECT_TRUE(w.grad().equal(rounded(f(g).t().mm(f(x)))));
  EXPECT_TRUE(x.grad().equal(rounded(f(g).mm(f(w)))));
  // mv's backward: the vector's gradient is the transposed matrix times the output's.
  const at::Tensor m = bf16({48, 300}, 23), v = bf16({300}, 24).requires_grad_(true);
  const at::Tensor gv = bf16({48}, 25);
  at::mv(m, v).backward(gv);
  EXPECT_TRUE(v.grad().equal(rounded(f(m).t().mv(f(gv)))));
}

// The problem the kernels solve, measured where LibTorch 1.x would take its own GEMM: its bf16
// sums lose about 4% of a 1024-long product (the fp32-product route 0.3%, the rounding of the
// output); and the kernels leave other dtypes and, once unregistered, bf16 as ATen has them.
TEST(CpuBf16Matmul, OnlyBf16ChangesAndOnlyWhileRegistered) {
  WithoutOneDnn no_onednn;
  const at::Tensor a = bf16({256, 1024}, 11), b = bf16({1024, 192}, 12);
  const at::Tensor exact = f(a).mm(f(b));
  const at::Tensor fa = torch::randn({33, 65}), fb = torch::randn({65, 17});
  const at::Tensor fp32_before = fa.mm(fb), native = a.mm(b);
  {
    Fp32AccumulatingBf16Matmul fp32_products;
    EXPECT_TRUE(fa.mm(fb).equal(fp32_before));
    EXPECT_TRUE(fa.to(at::kDouble).mm(fb.to(at::kDouble)).equal(
        at::cpu::mm(fa.to(at::kDouble), fb.to(at::kDouble))));
    EXPECT_LT(relative_error(a.mm(b), exact), 0.005);
  }
  EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active());
  EXPECT_TRUE(a.mm(b).equal(native));
#if DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16
  EXPECT_TRUE(cpu_bf16_gemm_accumulates_in_bf16());
  EXPECT_GT(relative_error(native, exact), 0.02) << "LibTorch 1.x's bf16 GEMM without oneDNN";
#else
  EXPECT_FALSE(cpu_bf16_gemm_accumulates_in_bf16());
#endif
}

// Where the GEMM accumulates in fp32 (oneDNN on AVX-512, or torch 2.x), LibTorch 1.x's dot still
// sums in bf16: the dots-only scope takes dot and vdot and leaves every other product to ATen.
TEST(CpuBf16Matmul, TheDotsScopeTakesDotsOnly) {
  const at::Tensor x = bf16({4096}, 26), y = bf16({4096}, 27);
  const at::Tensor exact = f(x).dot(f(y));
  const at::Tensor a = bf16({64, 128}, 28), b = bf16({128, 32}, 29), v = bf16({128}, 30);
  const at::Tensor native_dot = at::dot(x, y), native_mm = at::mm(a, b), native_mv = at::mv(a, v);
  {
    Fp32AccumulatingBf16Matmul dots(Bf16Products::kDots);
    EXPECT_TRUE(Fp32AccumulatingBf16Matmul::active(Bf16Products::kDots));
    EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active(Bf16Products::kEvery));
    EXPECT_TRUE(at::dot(x, y).equal(rounded(exact)));
    EXPECT_TRUE(at::vdot(x, y).equal(rounded(exact)));
    EXPECT_TRUE(at::mm(a, b).equal(native_mm));
    EXPECT_TRUE(at::mv(a, v).equal(native_mv));
    EXPECT_TRUE(at::dot(f(x), f(y)).equal(exact));  // fp32 to ATen's own
  }
  EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active(Bf16Products::kDots));
  EXPECT_TRUE(at::dot(x, y).equal(native_dot));
#if DS_CPU_BF16_GEMM_MAY_ACCUMULATE_IN_BF16
  EXPECT_TRUE(cpu_bf16_dot_accumulates_in_bf16());
  EXPECT_GT(relative_error(native_dot, exact), 0.01) << "LibTorch 1.x's bf16 dot";
#else
  EXPECT_FALSE(cpu_bf16_dot_accumulates_in_bf16());
#endif
}

TEST(CpuBf16Matmul, RegistrationsNestAndTheLastOneRestores) {
  {
    Fp32AccumulatingBf16Matmul outer;
    {
      Fp32AccumulatingBf16Matmul inner;
      EXPECT_TRUE(Fp32AccumulatingBf16Matmul::active());
    }
    EXPECT_TRUE(Fp32AccumulatingBf16Matmul::active());
  }
  EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active());
}

TEST(CpuBf16Matmul, TheEnvironmentVariableIsChecked) {
  ::setenv("DS_CPU_BF16_MATMUL", "fast", 1);
  try {
    use_fp32_accumulating_bf16_matmul_where_needed();
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("DS_CPU_BF16_MATMUL=fast"), std::string::npos)
        << e.what();
  }
  ::setenv("DS_CPU_BF16_MATMUL", "native", 1);
  {
    WithoutOneDnn no_onednn;  // where auto would register them
    EXPECT_EQ(use_fp32_accumulating_bf16_matmul_where_needed(), "");
  }
  EXPECT_EQ(use_fp32_accumulating_bf16_matmul_where_needed(), "");
  EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active());
  EXPECT_FALSE(Fp32AccumulatingBf16Matmul::active(Bf16Products::kDots));
  ::unsetenv("DS_CPU_BF16_MATMUL");
}

}  // namespace
}  // namespace deepspeed::runtime

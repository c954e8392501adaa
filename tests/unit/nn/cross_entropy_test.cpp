// chunked_cross_entropy and linear_cross_entropy against cross_entropy over fp32 logits (the
// loss they replace): losses and every gradient, for each reduction, ignored targets, block
// sizes down to one row, 16-bit inputs, a bias, padded vocabulary rows and autocast.
#include "deepspeed/cross_entropy.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/autocast.h"
#include "deepspeed/errors.h"
#include "runtime/precision/cpu_bf16_matmul.h"

namespace deepspeed {
namespace {

namespace F = torch::nn::functional;

// bf16 products as a bf16 engine takes them: in fp32 where LibTorch's GEMM would accumulate in
// bf16 (AVX2-only CPUs; any CPU with DS_TEST_CPU_BF16_GEMM_WITHOUT_ONEDNN=1, the avx2 variant).
class Bf16MatmulAsTheEngine : public ::testing::Environment {
 public:
  void SetUp() override { runtime::use_fp32_accumulating_bf16_matmul_where_needed(); }
};
const auto* const kBf16MatmulAsTheEngine =
    ::testing::AddGlobalTestEnvironment(new Bf16MatmulAsTheEngine);

F::CrossEntropyFuncOptions::reduction_t torch_reduction(LossReduction r) {
  switch (r) {
    case LossReduction::kNone:
      return torch::kNone;
    case LossReduction::kSum:
      return torch::kSum;
    case LossReduction::kMean:
      break;
  }
  return torch::kMean;
}

const char* name(LossReduction r) {
  return r == LossReduction::kNone ? "none" : r == LossReduction::kSum ? "sum" : "mean";
}

at::Tensor reference_loss(const at::Tensor& logits, const at::Tensor& target, LossReduction r) {
  return F::cross_entropy(logits.to(torch::kFloat), target,
                          F::CrossEntropyFuncOptions().ignore_index(-100).reduction(
                              torch_reduction(r)));
}

// |got - want| within `tol` of want's largest magnitude (at least 1).
void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double tol) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const at::Tensor g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  const double diff = (g - w).abs().max().item<double>();
  EXPECT_LE(diff, tol * std::max(1.0, w.abs().max().item<double>())) << what << ": " << diff;
}

// The upstream gradient: varied per token for kNone, so every row's scale matters.
at::Tensor upstream(const at::Tensor& loss) {
  if (loss.dim() == 0) return torch::full({}, 0.75);
  return torch::linspace(0.5, 1.5, loss.numel()).view(loss.sizes());
}

at::Tensor targets_with_ignored(int64_t n, int64_t vocab) {
  at::Tensor t = torch::randint(vocab, {n}, torch::kLong);
  t.index_put_({torch::arange(0, n, 3)}, -100);  // every third token ignored
  return t;
}

TEST(ChunkedCrossEntropy, EqualsCrossEntropyOverFp32Logits) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf}) {
    for (auto r : {LossReduction::kNone, LossReduction::kSum, LossReduction::kMean}) {
      for (std::optional<int64_t> block : {std::optional<int64_t>(1), std::optional<int64_t>(4),
                                           std::optional<int64_t>()}) {
        torch::manual_seed(3);
        const at::Tensor base = (torch::randn({10, 37}) * 3).to(dtype);
        const at::Tensor target = targets_with_ignored(10, 37);
        const std::string what = std::string(c10::toString(dtype)) + " " + name(r) + " block " +
                                 (block ? std::to_string(*block) : "default");
        at::Tensor a = base.clone().requires_grad_(), b = base.clone().requires_grad_();
        ChunkedCrossEntropyOptions o;
        o.reduction = r;
        o.block_rows = block;
        const at::Tensor got = chunked_cross_entropy(a, target, o);
        const at::Tensor want = reference_loss(b, target, r);
        expect_close(got, want, what + " loss", 1e-6);
        got.backward(upstream(got));
        want.backward(upstream(want));
        ASSERT_EQ(a.grad().scalar_type(), dtype) << what;
        // Both round the same fp32 gradient to the logits' dtype; it may land one unit apart.
        expect_close(a.grad(), b.grad(), what + " gradient", dtype == torch::kFloat ? 1e-6 : 1e-2);
        if (r == LossReduction::kNone) {
          EXPECT_EQ(got.index({torch::arange(0, 10, 3)}).abs().sum().item<float>(), 0.0f);
        }
        EXPECT_EQ(a.grad().index({torch::arange(0, 10, 3)}).abs().sum().item<float>(), 0.0f)
            << what << ": ignored rows get no gradient";
      }
    }
  }
}

TEST(ChunkedCrossEntropy, LeavesTheLogitsAsTheyWere) {
  torch::manual_seed(4);
  at::Tensor logits = torch::randn({6, 11}).requires_grad_();
  const at::Tensor before = logits.detach().clone();
  chunked_cross_entropy(logits, torch::randint(11, {6}, torch::kLong)).backward();
  EXPECT_TRUE(torch::equal(logits.detach(), before));
}

TEST(ChunkedCrossEntropy, MeanOverNoCountedTokenIsNaN) {
  const at::Tensor logits = torch::randn({3, 5});
  const at::Tensor none = torch::full({3}, -100, torch::kLong);
  EXPECT_TRUE(std::isnan(chunked_cross_entropy(logits, none).item<float>()));
  ChunkedCrossEntropyOptions sum;
  sum.reduction = LossReduction::kSum;
  EXPECT_EQ(chunked_cross_entropy(logits, none, sum).item<float>(), 0.0f);
}

template <typename Fn>
std::string usage_error(Fn&& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

TEST(ChunkedCrossEntropy, RejectsBadInputByName) {
  const at::Tensor logits = torch::randn({4, 5}, torch::requires_grad());
  const at::Tensor target = torch::tensor({0, 4, -100, 1}, torch::kLong);
  EXPECT_NE(usage_error([&] {
              chunked_cross_entropy(logits, torch::tensor({0, 5, 1, 1}, torch::kLong));
            }).find("target 5 at token 1 is outside the vocabulary [0, 5)"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { chunked_cross_entropy(logits, target.to(torch::kInt)); })
                .find("targets must be int64"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { chunked_cross_entropy(logits.view({2, 2, 5}), target); })
                .find("expected [rows, vocab] logits and [rows] targets"),
            std::string::npos);
  ChunkedCrossEntropyOptions zero;
  zero.block_rows = 0;
  EXPECT_NE(usage_error([&] { chunked_cross_entropy(logits, target, zero); })
                .find("block_rows must be at least 1"),
            std::string::npos);
  const at::Tensor loss = chunked_cross_entropy(logits, target);
  EXPECT_NE(usage_error([&] {
              torch::autograd::grad({loss}, {logits}, {}, /*retain_graph=*/true,
                                    /*create_graph=*/true);
            }).find("cannot be differentiated again"),
            std::string::npos);
}

// The unfused head: the product in the inputs' dtype (on 2-D input, where linear adds the bias
// inside the GEMM, rounding once), the loss over its fp32 copy.
at::Tensor reference_head_loss(const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& bias, const at::Tensor& target, LossReduction r) {
  const at::Tensor logits = F::linear(hidden.reshape({-1, hidden.size(-1)}), weight, bias);
  const at::Tensor loss = reference_loss(logits, target.reshape({-1}), r);
  return r == LossReduction::kNone ? loss.view(target.sizes()) : loss;
}

TEST(LinearCrossEntropy, EqualsTheHeadThenCrossEntropy) {
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool with_bias : {false, true}) {
      for (auto r : {LossReduction::kNone, LossReduction::kSum, LossReduction::kMean}) {
        for (std::optional<int64_t> chunk : {std::optional<int64_t>(1), std::optional<int64_t>(4),
                                             std::optional<int64_t>()}) {
          torch::manual_seed(5);
          const at::Tensor h0 = torch::randn({2, 5, 16}).to(dtype);
          const at::Tensor w0 = (torch::randn({37, 16}) / 4).to(dtype);
          const at::Tensor b0 = (torch::randn({37}) / 4).to(dtype);
          const at::Tensor target = targets_with_ignored(10, 37).view({2, 5});
          const std::string what = std::string(c10::toString(dtype)) +
                                   (with_bias ? " bias " : " ") + name(r) + " chunk " +
                                   (chunk ? std::to_string(*chunk) : "default");
          at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                     b = b0.clone().requires_grad_();
          at::Tensor hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_(),
                     br = b0.clone().requires_grad_();
          LinearCrossEntropyOptions o;
          o.reduction = r;
          o.chunk_size = chunk;
          if (with_bias) o.bias = b;
          const at::Tensor got = linear_cross_entropy(h, w, target, o);
          const at::Tensor want =
              reference_head_loss(hr, wr, with_bias ? br : at::Tensor(), target, r);
          const bool fp32 = dtype == torch::kFloat;
          expect_close(got, want, what + " loss", fp32 ? 1e-5 : 1e-6);
          got.backward(upstream(got));
          want.backward(upstream(want));
          // 16-bit: the reference rounds the logits' gradient to bf16 before its GEMMs, as we do,
          // but sums blocks in another order.
          const double tol = fp32 ? 1e-5 : 2e-2;
          expect_close(h.grad(), hr.grad(), what + " hidden gradient", tol);
          expect_close(w.grad(), wr.grad(), what + " weight gradient", tol);
          if (with_bias) expect_close(b.grad(), br.grad(), what + " bias gradient", tol);
        }
      }
    }
  }
}

// Gemma 2's final_logit_softcapping: the head's logits capped as transformers caps them (in
// their dtype: divided, tanh, multiplied), then the loss; the fused loss caps each block alike.
TEST(LinearCrossEntropy, SoftCapEqualsTheCappedHead) {
  const double cap = 0.75;  // logits of order 2 here: the cap weighs in
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    for (bool with_bias : {false, true}) {
      torch::manual_seed(8);
      const at::Tensor h0 = torch::randn({11, 16}).to(dtype);
      const at::Tensor w0 = (torch::randn({29, 16}) / 2).to(dtype);
      const at::Tensor b0 = torch::randn({29}).to(dtype);
      const at::Tensor target = targets_with_ignored(11, 29);
      const std::string what = std::string(c10::toString(dtype)) + (with_bias ? " bias" : "");
      at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_(),
                 b = b0.clone().requires_grad_();
      at::Tensor hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_(),
                 br = b0.clone().requires_grad_();
      LinearCrossEntropyOptions o;
      o.chunk_size = 4;
      o.logit_softcap = cap;
      if (with_bias) o.bias = b;
      const at::Tensor got = linear_cross_entropy(h, w, target, o);
      const at::Tensor logits = F::linear(hr, wr, with_bias ? br : at::Tensor());
      const at::Tensor want =
          reference_loss(torch::tanh(logits / cap) * cap, target, LossReduction::kMean);
      const bool fp32 = dtype == torch::kFloat;
      expect_close(got, want, what + " loss", fp32 ? 1e-5 : 1e-6);
      const at::Tensor uncapped = reference_loss(logits, target, LossReduction::kMean);
      EXPECT_GT((uncapped - want).abs().item<double>(), 0.1) << what;
      got.backward();
      want.backward();
      const double tol = fp32 ? 1e-5 : 2e-2;
      expect_close(h.grad(), hr.grad(), what + " hidden gradient", tol);
      expect_close(w.grad(), wr.grad(), what + " weight gradient", tol);
      if (with_bias) expect_close(b.grad(), br.grad(), what + " bias gradient", tol);
    }
  }
  LinearCrossEntropyOptions negative;
  negative.logit_softcap = -1.0;
  EXPECT_NE(usage_error([&] {
              linear_cross_entropy(torch::randn({2, 4}), torch::randn({5, 4}),
                                   torch::tensor({0, 1}, torch::kLong), negative);
            }).find("logit_softcap must be 0 (none) or positive, got -1"),
            std::string::npos);
}

TEST(LinearCrossEntropy, PaddedRowsStayOutOfTheSoftmax) {
  torch::manual_seed(6);
  const at::Tensor h0 = torch::randn({7, 8});
  const at::Tensor w0 = torch::randn({40, 8});  // vocabulary 37, padded to 40
  const at::Tensor target = targets_with_ignored(7, 37);
  at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
  LinearCrossEntropyOptions o;
  o.vocab_size = 37;
  o.chunk_size = 3;
  const at::Tensor got = linear_cross_entropy(h, w, target, o);
  const at::Tensor want =
      reference_head_loss(hr, wr.slice(0, 0, 37), at::Tensor(), target, LossReduction::kMean);
  expect_close(got, want, "loss", 1e-5);
  got.backward();
  want.backward();
  expect_close(h.grad(), hr.grad(), "hidden gradient", 1e-5);
  expect_close(w.grad(), wr.grad(), "weight gradient (zero on the padding)", 1e-5);
  EXPECT_EQ(w.grad().slice(0, 37).abs().sum().item<float>(), 0.0f);
  EXPECT_NE(usage_error([&] {
              linear_cross_entropy(h0, w0, torch::tensor({0, 1, 2, 3, 4, 5, 38}, torch::kLong), o);
            }).find("target 38 at token 6 is outside the vocabulary [0, 37)"),
            std::string::npos);
}

TEST(LinearCrossEntropy, UnderAutocastTakesTheProductInItsDtype) {
  torch::manual_seed(7);
  const at::Tensor h0 = torch::randn({9, 16}), w0 = torch::randn({23, 16}) / 4;
  const at::Tensor target = targets_with_ignored(9, 23);
  at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor hr = h0.clone().requires_grad_(), wr = w0.clone().requires_grad_();
  at::Tensor got, want;
  {
    AutocastScope autocast(c10::kCPU, torch::kBFloat16);
    LinearCrossEntropyOptions o;
    o.chunk_size = 2;
    got = linear_cross_entropy(h, w, target, o);
    want = reference_head_loss(hr, wr, at::Tensor(), target, LossReduction::kMean);
  }
  expect_close(got, want, "loss", 1e-6);
  got.backward();
  want.backward();
  ASSERT_EQ(h.grad().scalar_type(), torch::kFloat);
  expect_close(h.grad(), hr.grad(), "hidden gradient", 2e-2);
  expect_close(w.grad(), wr.grad(), "weight gradient", 2e-2);
}

TEST(LinearCrossEntropy, RejectsBadInputByName) {
  const at::Tensor h = torch::randn({4, 8}), w = torch::randn({10, 8});
  const at::Tensor t = torch::tensor({0, 1, 2, 3}, torch::kLong);
  EXPECT_NE(usage_error([&] { linear_cross_entropy(h, torch::randn({10, 7}), t); })
                .find("expected hidden [..., dim] and weight [vocab rows, dim]"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { linear_cross_entropy(h, w, t.view({2, 2})); })
                .find("does not match hidden"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { linear_cross_entropy(h, w.to(torch::kBFloat16), t); })
                .find("must share a floating dtype"),
            std::string::npos);
  LinearCrossEntropyOptions bad_bias;
  bad_bias.bias = torch::zeros({9});
  EXPECT_NE(usage_error([&] { linear_cross_entropy(h, w, t, bad_bias); }).find("bias must be [10]"),
            std::string::npos);
  LinearCrossEntropyOptions zero;
  zero.chunk_size = 0;
  EXPECT_NE(usage_error([&] { linear_cross_entropy(h, w, t, zero); })
                .find("chunk_size must be at least 1"),
            std::string::npos);
}

}  // namespace
}  // namespace deepspeed

// linear_cross_entropy over a vocabulary-parallel head on 2 Gloo ranks: each rank holds half of
// a padded vocabulary's rows (37 real rows padded to 40), and its loss and gradients equal, in
// the rank itself, those of the whole head followed by cross_entropy in one process.
#include "deepspeed/cross_entropy.h"

#include <string>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

namespace F = torch::nn::functional;
using testing::run_ranks;

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double tol) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(torch::kDouble), w = want.to(torch::kDouble);
  const double diff = (g - w).abs().max().item<double>();
  EXPECT_LE(diff, tol * std::max(1.0, w.abs().max().item<double>())) << what << ": " << diff;
}

TEST(CrossEntropyDist, VocabParallelLinearCrossEntropyEqualsTheWholeHead) {
  run_ranks(2, [](int rank, int) {
    const comm::Group group = comm::world();
    constexpr int64_t kVocab = 37, kPadded = 40, kRows = kPadded / 2, kDim = 16;
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      for (auto r : {LossReduction::kMean, LossReduction::kNone}) {
        for (std::optional<int64_t> chunk : {std::optional<int64_t>(3), std::optional<int64_t>()}) {
          const std::string what = std::string(c10::toString(dtype)) +
                                   (r == LossReduction::kMean ? " mean" : " none") +
                                   (chunk ? " chunk 3" : " default chunk");
          torch::manual_seed(8);  // the same inputs on both ranks
          const at::Tensor h0 = torch::randn({3, 4, kDim}).to(dtype);
          const at::Tensor full_w = (torch::randn({kPadded, kDim}) / 4).to(dtype);
          at::Tensor target = torch::randint(kVocab, {3, 4}, torch::kLong);
          target.index_put_({0, 1}, -100);
          target.index_put_({2, 3}, kVocab - 1);  // in the second rank's real rows

          at::Tensor h = h0.clone().requires_grad_();
          at::Tensor w = full_w.slice(0, rank * kRows, (rank + 1) * kRows).clone().requires_grad_();
          LinearCrossEntropyOptions o;
          o.tp_group = group;
          o.vocab_size = kVocab;
          o.reduction = r;
          o.chunk_size = chunk;
          const at::Tensor loss = linear_cross_entropy(h, w, target, o);

          at::Tensor hr = h0.clone().requires_grad_(), wr = full_w.clone().requires_grad_();
          const at::Tensor logits =
              F::linear(hr.reshape({-1, kDim}), wr.slice(0, 0, kVocab)).to(torch::kFloat);
          at::Tensor want = F::cross_entropy(
              logits, target.reshape({-1}),
              F::CrossEntropyFuncOptions().reduction(r == LossReduction::kMean
                                                         ? F::CrossEntropyFuncOptions::reduction_t(
                                                               torch::kMean)
                                                         : torch::kNone));
          if (r == LossReduction::kNone) want = want.view(target.sizes());
          expect_close(loss, want, what + " loss", 1e-5);
          const at::Tensor up = r == LossReduction::kMean
                                    ? torch::full({}, 1.25)
                                    : torch::linspace(0.5, 1.5, 12).view({3, 4});
          loss.backward(up);
          want.backward(up);
          const double tol = dtype == torch::kFloat ? 1e-5 : 2e-2;
          expect_close(h.grad(), hr.grad(), what + " hidden gradient (summed over the ranks)", tol);
          expect_close(w.grad(), wr.grad().slice(0, rank * kRows, (rank + 1) * kRows),
                       what + " this rank's weight rows", tol);
          if (rank == 1) {
            EXPECT_EQ(w.grad().slice(0, kVocab - kRows).abs().sum().item<float>(), 0.0f)
                << what << ": the padding rows get no gradient";
          }
        }
      }
    }
  });
}

}  // namespace
}  // namespace deepspeed

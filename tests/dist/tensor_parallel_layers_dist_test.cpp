// Megatron-style tensor-parallel layers on 2 Gloo ranks (tensor-parallel group = the world),
// each compared in the rank itself with the dense single-process layer built from the same
// seed: the full weights, the outputs and every gradient. Also the vocab-parallel
// cross-entropy with a padded vocabulary, and the RNG tracker's dropout masks.
#include "deepspeed/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multi_rank.h"

namespace deepspeed {
namespace {

namespace tp = tensor_parallel;
using testing::run_ranks;

// The full tensor from every rank's shard (all-gathered, then un-split as the layer split it).
at::Tensor gather_full(const at::Tensor& shard, int dim, int stride = 1) {
  const comm::Group g = comm::world();
  at::Tensor in = shard.detach().contiguous();
  at::Tensor flat = at::empty({g.size() * in.numel()}, in.options());
  comm::all_gather(flat, in, false, g);
  std::vector<at::Tensor> parts;
  for (int r = 0; r < g.size(); ++r) parts.push_back(flat.narrow(0, r * in.numel(), in.numel()).view(in.sizes()));
  return tp::unshard(parts, dim, stride);
}

void expect_close(const at::Tensor& got, const at::Tensor& want, const std::string& what,
                  double tol = 1e-6) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, tol * std::max(1.0, want.abs().max().item<double>())) << what;
}

TEST(TensorParallelLayersDist, ColumnAndRowParallelLinearEqualTheDenseLayers) {
  run_ranks(2, [](int rank, int) {
    const comm::Group g = comm::world();
    for (bool gather : {false, true}) {
      torch::manual_seed(11);
      torch::nn::Linear dense(6, 8);
      torch::manual_seed(11);
      tp::ColumnParallelLinearOptions o;
      o.gather_output = gather;
      tp::ColumnParallelLinear col(6, 8, g, o);
      EXPECT_EQ(col->weight.sizes(), (std::vector<int64_t>{4, 6}));
      EXPECT_TRUE(tp::is_tensor_parallel(col->weight));
      expect_close(gather_full(col->weight, 0), dense->weight, "column full weight", 0);
      expect_close(gather_full(col->bias, 0), dense->bias, "column full bias", 0);

      torch::manual_seed(5);
      auto x = torch::randn({3, 6}, torch::requires_grad());
      auto xd = x.detach().clone().requires_grad_();
      auto y = col(x);
      auto yd = dense(xd);
      auto w = torch::arange(yd.numel(), torch::kFloat).view(yd.sizes()) / 7.0;  // d loss / d y
      if (gather) {
        expect_close(y, yd, "column gathered output");
        (y * w).sum().backward();
      } else {
        expect_close(y, yd.narrow(1, rank * 4, 4), "column split output");
        (y * w.narrow(1, rank * 4, 4)).sum().backward();
      }
      (yd * w).sum().backward();
      expect_close(x.grad(), xd.grad(), "column input gradient (all-reduced)");
      expect_close(col->weight.grad(), dense->weight.grad().narrow(0, rank * 4, 4), "column dW");
      expect_close(col->bias.grad(), dense->bias.grad().narrow(0, rank * 4, 4), "column db");
    }
    for (bool parallel_input : {false, true}) {
      torch::manual_seed(12);
      torch::nn::Linear dense(8, 5);
      torch::manual_seed(12);
      tp::RowParallelLinearOptions o;
      o.input_is_parallel = parallel_input;
      tp::RowParallelLinear row(8, 5, g, o);
      EXPECT_EQ(row->weight.sizes(), (std::vector<int64_t>{5, 4}));
      EXPECT_FALSE(tp::is_tensor_parallel(row->bias));  // replicated
      expect_close(gather_full(row->weight, 1), dense->weight, "row full weight", 0);
      torch::manual_seed(6);
      auto full_x = torch::randn({3, 8});
      auto x = (parallel_input ? full_x.narrow(1, rank * 4, 4).clone() : full_x.clone()).requires_grad_();
      auto xd = full_x.clone().requires_grad_();
      auto y = row(x);
      auto yd = dense(xd);
      expect_close(y, yd, "row output");
      auto w = torch::arange(yd.numel(), torch::kFloat).view(yd.sizes()) / 5.0;
      (y * w).sum().backward();
      (yd * w).sum().backward();
      expect_close(x.grad(), parallel_input ? xd.grad().narrow(1, rank * 4, 4) : xd.grad(),
                   "row input gradient");
      expect_close(row->weight.grad(), dense->weight.grad().narrow(1, rank * 4, 4), "row dW");
      expect_close(row->bias.grad(), dense->bias.grad(), "row db");
    }
  });
}

TEST(TensorParallelLayersDist, FusedQkvColumnThenRowIsTheDenseAttentionProjection) {
  // A q|k|v projection split by heads (stride 3) feeding a row-parallel output projection: the
  // Megatron attention pattern, one all-reduce forward and one backward.
  run_ranks(2, [](int rank, int) {
    const comm::Group g = comm::world();
    const int64_t C = 8;
    torch::manual_seed(21);
    torch::nn::Linear qkv_d(C, 3 * C), proj_d(C, C);
    torch::manual_seed(21);
    tp::ColumnParallelLinearOptions co;
    co.partition_stride = 3;
    tp::ColumnParallelLinear qkv(C, 3 * C, g, co);
    tp::RowParallelLinear proj(C, C, g);
    expect_close(gather_full(qkv->weight, 0, 3), qkv_d->weight, "qkv full weight", 0);
    // This rank's rows are its half of q, of k and of v.
    expect_close(qkv->weight.narrow(0, 0, C / 2), qkv_d->weight.narrow(0, rank * C / 2, C / 2), "q rows", 0);
    expect_close(qkv->weight.narrow(0, C, C / 2), qkv_d->weight.narrow(0, 2 * C + rank * C / 2, C / 2), "v rows", 0);
    torch::manual_seed(7);
    auto x = torch::randn({4, C});
    auto xd = x.clone().requires_grad_();
    auto xt = x.clone().requires_grad_();
    // "attention": q * k + v per column, elementwise (keeps the head split local).
    auto mix = [](const at::Tensor& qkv_out) {
      auto parts = qkv_out.chunk(3, -1);
      return torch::tanh(parts[0] * parts[1]) + parts[2];
    };
    auto yd = proj_d(mix(qkv_d(xd)));
    auto y = proj(mix(qkv(xt)));
    expect_close(y, yd, "attention-pattern output");
    y.pow(2).sum().backward();
    yd.pow(2).sum().backward();
    expect_close(xt.grad(), xd.grad(), "input gradient");
    expect_close(gather_full(qkv->weight.grad(), 0, 3), qkv_d->weight.grad(), "qkv dW");
    expect_close(gather_full(proj->weight.grad(), 1), proj_d->weight.grad(), "proj dW");
  });
}

TEST(TensorParallelLayersDist, VocabParallelEmbeddingAndCrossEntropyEqualTheUnpaddedModel) {
  run_ranks(2, [](int rank, int) {
    const comm::Group g = comm::world();
    const int64_t V = 11, D = 4;  // padded to 16 (make_vocab_size_divisible_by 4 x 2 ranks)
    torch::manual_seed(31);
    torch::nn::Embedding dense(V, D);
    torch::manual_seed(31);
    tp::VocabParallelEmbeddingOptions o;
    o.make_vocab_size_divisible_by = 4;
    tp::VocabParallelEmbedding emb(V, D, g, o);
    EXPECT_EQ(emb->padded_vocab_size(), 16);
    EXPECT_EQ(emb->vocab_start(), rank * 8);
    at::Tensor full = gather_full(emb->weight, 0);
    expect_close(full.narrow(0, 0, V), dense->weight, "embedding full weight", 0);
    EXPECT_EQ(full.narrow(0, V, 16 - V).abs().sum().item<double>(), 0.0) << "padded rows are zero";
    auto ids = torch::tensor({{0, 7, 8, 10}, {3, 9, 1, 8}}, torch::kLong);
    auto e = emb(ids);
    auto ed = dense(ids);
    expect_close(e, ed, "embedding lookup");

    // Output head tied to the embedding: logits = h @ W^T over this rank's vocabulary columns.
    torch::manual_seed(8);
    auto h = torch::randn({2, 4, D});
    auto targets = torch::tensor({{1, 8, 10, 2}, {9, 0, 7, 3}}, torch::kLong);
    auto logits = torch::matmul(tp::copy_to_model_parallel_region(h, g), emb->weight.t());
    auto loss = tp::vocab_parallel_cross_entropy(logits, targets, g, emb->vocab_start(), V).mean();
    auto logits_d = torch::matmul(h, dense->weight.t());
    auto loss_d = torch::nn::functional::cross_entropy(logits_d.view({-1, V}), targets.view({-1}));
    EXPECT_NEAR(loss.item<double>(), loss_d.item<double>(), 1e-6);
    // Padding rows with large values would dominate an unmasked softmax: still excluded.
    loss.backward();
    loss_d.backward();
    at::Tensor grad_full = gather_full(emb->weight.grad(), 0);
    expect_close(grad_full.narrow(0, 0, V), dense->weight.grad(), "embedding + head gradient");
    EXPECT_EQ(grad_full.narrow(0, V, 16 - V).abs().sum().item<double>(), 0.0);

    // The loss ignores whatever the padded columns hold.
    auto noisy = logits.detach().clone();
    if (rank == 1) noisy.narrow(-1, V - 8, 16 - V).fill_(50.0);
    auto loss2 = tp::vocab_parallel_cross_entropy(noisy, targets, g, emb->vocab_start(), V).mean();
    EXPECT_NEAR(loss2.item<double>(), loss_d.item<double>(), 1e-6);
    EXPECT_THROW(tp::vocab_parallel_cross_entropy(noisy, targets + 5, g, emb->vocab_start(), V),
                 UsageError);
  });
}

TEST(TensorParallelLayersDist, RngTrackerMasksMatchTheSingleProcessModelOutsideTheRegion) {
  run_ranks(2, [](int rank, int) {
    const comm::Group g = comm::world();
    tp::model_parallel_manual_seed(1234, g);
    auto x = torch::ones({64});
    auto outside = torch::dropout(x, 0.5, true);  // replicated activations: default generator
    at::Tensor inside;
    {
      auto fork = tp::get_rng_tracker().fork();
      inside = torch::dropout(x, 0.5, true);  // split heads: the model-parallel stream
    }
    auto after = torch::dropout(x, 0.5, true);
    // The single-process model seeded 1234 draws the same masks outside the region, and the fork
    // did not advance the default stream.
    torch::manual_seed(1234);
    auto want_outside = torch::dropout(x, 0.5, true);
    auto want_after = torch::dropout(x, 0.5, true);
    EXPECT_TRUE(torch::equal(outside, want_outside));
    EXPECT_TRUE(torch::equal(after, want_after));
    // Inside: seed + 2718 + tensor-parallel rank (Megatron's), so the two ranks differ.
    torch::manual_seed(1234 + 2718 + rank);
    EXPECT_TRUE(torch::equal(inside, torch::dropout(x, 0.5, true)));
    at::Tensor both = at::empty({128});
    comm::all_gather(both, inside.contiguous(), false, g);
    EXPECT_FALSE(torch::equal(both.narrow(0, 0, 64), both.narrow(0, 64, 64)));
    // A second fork continues the tracked stream instead of restarting it.
    at::Tensor again;
    {
      auto fork = tp::get_rng_tracker().fork();
      again = torch::dropout(x, 0.5, true);
    }
    EXPECT_FALSE(torch::equal(inside, again));
    EXPECT_THROW(tp::get_rng_tracker().fork("no-such-state"), UsageError);
  });
}

TEST(TensorParallelLayersDist, AutoTpRefusesWidthsNotDivisibleByTheGroup) {
  run_ranks(2, [](int, int) {
    struct Mlp : torch::nn::Module {
      Mlp() {
        c_fc = register_module("c_fc", torch::nn::Linear(4, 5));
        c_proj = register_module("c_proj", torch::nn::Linear(5, 4));
      }
      torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
    };
    Mlp m;
    try {
      tp::auto_tp(m, comm::world());
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("(5) is not divisible by the tensor-parallel size autotp_size (2)"),
                std::string::npos) << msg;
    }
    tp::AutoTpOptions o;
    o.num_heads = 3;
    Mlp m2;
    try {
      tp::auto_tp(m2, comm::world(), o);
      ADD_FAILURE() << "expected a ConfigError";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("number of attention heads (3)"), std::string::npos)
          << e.what();
    }
  });
}

}  // namespace
}  // namespace deepspeed

// sparse_gradients on Gloo ranks: the embedding weight's gradient is reduced as rows (each rank
// all-gathers the rows its batch touched) and training ends where the dense reduction ends: bit
// for bit on two ranks, where the average is an exact halving either way, and within rounding on
// three. Under ZeRO-1 the key changes nothing (as in DeepSpeed). Checkpoints list the weight in
// sparse_tensor_module_names.
#include "deepspeed/deepspeed.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/checkpoint.h"
#include "runtime/zero/zero_optimizer.h"  // ReductionStats
#include "support/multi_rank.h"
#include "support/shared_run_dir.h"

namespace deepspeed {
namespace {

using testing::run_ranks;

struct EmbedNet : torch::nn::Module {
  EmbedNet() {
    torch::manual_seed(11);
    emb = register_module("emb", torch::nn::Embedding(40, 6));
    head = register_module("head", torch::nn::Linear(6, 3));
  }
  torch::Tensor forward(const torch::Tensor& tokens, const torch::Tensor& y) {
    return torch::nn::functional::mse_loss(head(emb(tokens).mean(1)), y);
  }
  torch::nn::Embedding emb{nullptr};
  torch::nn::Linear head{nullptr};
};

// Rank r's tokens cover a window of the vocabulary that overlaps its neighbours'; most rows are
// untouched by any rank.
std::pair<torch::Tensor, torch::Tensor> batch(int64_t step, int rank) {
  auto tokens = (torch::arange(8, torch::kLong).reshape({2, 4}) * 3 + rank * 5 + step) % 40;
  auto y = torch::sin(torch::arange(6, torch::kFloat).reshape({2, 3}) + step + rank);
  return {tokens, y};
}

// Trains 3 optimizer steps; `rows_sent`: the embedding rows the last reduction all-gathered.
std::vector<at::Tensor> train(int rank, bool sparse, int stage, int64_t* rows_sent = nullptr) {
  auto model = std::make_shared<EmbedNet>();
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"gradient_accumulation_steps", 2},
              {"sparse_gradients", sparse},
              {"zero_allow_untested_optimizer", true},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.5}, {"momentum", 0.9}}}}},
              {"zero_optimization", {{"stage", stage}}}};
  auto [engine, opt, sched] = initialize(model, cfg);
  for (int64_t micro = 0; micro < 6; ++micro) {
    auto [tokens, y] = batch(micro, rank);
    engine->backward(engine->forward(tokens, y));
    engine->step();
  }
  if (rows_sent != nullptr) *rows_sent = engine->reduction_stats().sparse_rows_sent;
  std::vector<at::Tensor> params;
  for (const auto& p : model->parameters()) params.push_back(p.detach().clone());
  return params;
}

TEST(SparseGradientsDist, EmbeddingRowsReduceAsTheDenseGradientOnTwoRanks) {
  run_ranks(2, [](int rank, int) {
    int64_t dense_rows = -1, sparse_rows = -1;
    const auto dense = train(rank, /*sparse=*/false, 0, &dense_rows);
    const auto sparse = train(rank, /*sparse=*/true, 0, &sparse_rows);
    EXPECT_EQ(dense_rows, 0);
    // The last accumulation's two micro-batches touched 8 tokens each, some repeated, of 40.
    EXPECT_GT(sparse_rows, 0);
    EXPECT_LE(sparse_rows, 16);
    ASSERT_EQ(dense.size(), sparse.size());
    for (size_t i = 0; i < dense.size(); ++i) EXPECT_TRUE(torch::equal(dense[i], sparse[i])) << i;
    // ZeRO-1 reduces densely whatever the key says (a warning), as DeepSpeed's does.
    const auto zero1 = train(rank, /*sparse=*/true, 1);
    for (size_t i = 0; i < dense.size(); ++i) EXPECT_TRUE(torch::allclose(dense[i], zero1[i])) << i;
  });
}

TEST(SparseGradientsDist, ThreeRanksAgreeWithTheDenseReduction) {
  run_ranks(3, [](int rank, int) {
    const auto dense = train(rank, false, 0);
    const auto sparse = train(rank, true, 0);
    for (size_t i = 0; i < dense.size(); ++i) {
      // 1/3 is applied to each row before the sum here, after it there: an ulp apart.
      EXPECT_TRUE(torch::allclose(dense[i], sparse[i], 1e-6, 1e-7)) << i;
    }
  });
}

TEST(SparseGradientsDist, CheckpointListsTheEmbeddingWeight) {
  const std::string path = testing::new_shared_run_dir("DS_SPARSE_GRADIENTS_OUT");
  run_ranks(2, [path](int, int) {
    auto model = std::make_shared<EmbedNet>();
    json cfg = {{"train_batch_size", 4},
                {"sparse_gradients", true},
                {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}}};
    auto [engine, opt, sched] = initialize(model, cfg);
    engine->save_checkpoint(path, "t");
    comm::barrier();
    const auto states = checkpoint::ModelStates::from_ivalue(
        checkpoint::load(path + "/t/mp_rank_00_model_states.pt"), "model states");
    EXPECT_EQ(states.sparse_tensor_module_names, std::vector<std::string>{"emb.weight"});
  });
}

}  // namespace
}  // namespace deepspeed

// Tensor parallelism in one process: the split/join arithmetic, Megatron's vocabulary padding,
// the layers on a group of one (exactly the dense layers), the vocab-parallel cross-entropy
// with padding, and the tensor_parallel config section.
#include "deepspeed/tensor_parallel.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "deepspeed/config.h"
#include "deepspeed/errors.h"

namespace deepspeed {
namespace {

namespace tp = tensor_parallel;

comm::Group group_of_one() {
  comm::init_distributed();  // a single process without RANK / WORLD_SIZE
  return comm::self_group("model");
}

TEST(TensorParallel, ShardOfAndUnshardRoundTripWithStride) {
  auto full = torch::arange(24, torch::kFloat).view({12, 2});
  // Stride 3 (q|k|v): part 1 of 2 is rows 2-3 of q, 6-7 of k, 10-11 of v.
  auto part1 = tp::shard_of(full, 0, 2, 1, 3);
  EXPECT_TRUE(torch::equal(part1, torch::cat({full.narrow(0, 2, 2), full.narrow(0, 6, 2),
                                              full.narrow(0, 10, 2)})));
  std::vector<at::Tensor> parts = {tp::shard_of(full, 0, 2, 0, 3), part1};
  EXPECT_TRUE(torch::equal(tp::unshard(parts, 0, 3), full));
  std::vector<at::Tensor> cols = {tp::shard_of(full, 1, 2, 0), tp::shard_of(full, 1, 2, 1)};
  EXPECT_TRUE(torch::equal(tp::unshard(cols, 1), full));
  EXPECT_THROW(tp::shard_of(full, 0, 5, 0), UsageError);
}

TEST(TensorParallel, VocabularyIsPaddedAsMegatron) {
  EXPECT_EQ(tp::padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(tp::padded_vocab_size(50257, 128, 2), 50432);
  EXPECT_EQ(tp::padded_vocab_size(11, 1, 4), 12);
  EXPECT_EQ(tp::padded_vocab_size(12, 1, 4), 12);
}

TEST(TensorParallel, LayersOnAGroupOfOneAreTheDenseLayers) {
  const comm::Group one = group_of_one();
  torch::manual_seed(3);
  torch::nn::Linear dense(5, 6);
  torch::manual_seed(3);
  tp::ColumnParallelLinear col(5, 6, one);
  EXPECT_TRUE(torch::equal(col->weight, dense->weight));
  EXPECT_TRUE(torch::equal(col->bias, dense->bias));
  auto x = torch::randn({2, 5});
  EXPECT_TRUE(torch::allclose(col(x), dense(x)));
  torch::manual_seed(4);
  torch::nn::Embedding emb_d(9, 3);
  torch::manual_seed(4);
  tp::VocabParallelEmbedding emb(9, 3, one);
  EXPECT_TRUE(torch::equal(emb->weight, emb_d->weight));
  // The init method sees the full weight; Megatron's layers zero the bias then.
  tp::RowParallelLinearOptions ro;
  ro.init_method = [](at::Tensor& w) { w.fill_(0.5); };
  tp::RowParallelLinear row(4, 2, one, ro);
  EXPECT_EQ(row->weight.sum().item<double>(), 4.0);
  EXPECT_EQ(row->bias.abs().sum().item<double>(), 0.0);
}

TEST(TensorParallel, CrossEntropyLeavesThePaddingOutOfTheSoftmax) {
  const comm::Group one = group_of_one();
  torch::manual_seed(5);
  auto logits = torch::randn({6, 7});
  auto targets = torch::tensor({0, 6, 3, 2, 5, 1}, torch::kLong);
  auto padded = torch::cat({logits, torch::full({6, 3}, 40.0)}, 1).requires_grad_();
  auto loss = tp::vocab_parallel_cross_entropy(padded, targets, one, 0, 7).mean();
  auto want = torch::nn::functional::cross_entropy(logits, targets);
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-6);
  loss.backward();
  EXPECT_EQ(padded.grad().narrow(1, 7, 3).abs().sum().item<double>(), 0.0);
}

TEST(TensorParallel, ConfigSectionAcceptsAutoTpAndRefusesTheRestByName) {
  auto cfg = DeepSpeedConfig::from_string(
      R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2, "tensor_parallel": {"tp_grain_size": 1}}})", 1);
  EXPECT_NO_THROW(cfg.check_supported());
  auto expect_refused = [](const std::string& text, const std::string& key) {
    auto c = DeepSpeedConfig::from_string(text, 1);
    try {
      c.check_supported();
      ADD_FAILURE() << "expected NotSupportedError for " << key;
    } catch (const NotSupportedError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  expect_refused(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2, "tp": {"tp_grain_size": 64}}})",
                 "tp_grain_size");
  expect_refused(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2, "tp_overlap_comm": true}})",
                 "tensor_parallel.tp_overlap_comm");
  // DeepSpeed 0.19.8's vocabulary-parallel head: replicated (null, false) is AutoTP here.
  for (const char* head : {"null", "false"}) {
    EXPECT_NO_THROW(DeepSpeedConfig::from_string(
                        std::string(R"({"train_batch_size": 4, "tensor_parallel": {"autotp_size": 2, )"
                                    R"("vocab_parallel_lm_head": )") +
                            head + R"(, "vocab_parallel_ce_backend": "torch"}})",
                        1)
                        .check_supported())
        << head;
  }
  expect_refused(R"({"train_batch_size": 4, "tensor_parallel": {"vocab_parallel_lm_head": true}})",
                 "tensor_parallel.vocab_parallel_lm_head");
  expect_refused(R"({"train_batch_size": 4, "tensor_parallel": {"vocab_parallel_ce_backend": "liger"}})",
                 "tensor_parallel.vocab_parallel_ce_backend \"liger\"");
  try {
    DeepSpeedConfig::from_string(
        R"({"train_batch_size": 4, "tensor_parallel": {"vocab_parallel_ce_backend": "triton"}})", 1);
    ADD_FAILURE() << "expected ConfigError for vocab_parallel_ce_backend \"triton\"";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  R"(tensor_parallel.vocab_parallel_ce_backend must be "torch" or "liger", got "triton")"),
              std::string::npos)
        << e.what();
  }
  // Unknown keys are errors (DeepSpeed's model forbids them).
  EXPECT_THROW(DeepSpeedConfig::from_string(
                   R"({"train_batch_size": 4, "tensor_parallel": {"autotp_sise": 2}})", 1),
               ConfigError);
}

}  // namespace
}  // namespace deepspeed

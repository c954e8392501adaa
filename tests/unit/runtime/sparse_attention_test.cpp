// Sparse attention without DeepSpeed at hand (deepspeed_sparse_attention_interop_test holds the
// layouts and the config reader against DeepSpeed's): layouts worked out by hand, Python's
// generator, the block-sparse computation against dense attention masked by the layout
// (outputs and gradients, with every extra), the modules, and the config's errors.
#include "deepspeed/sparse_attention.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "deepspeed/deepspeed.h"
#include "support/expect_throw.h"
#include "util/python_random.h"

namespace deepspeed::sparse_attention {
namespace {

SparseAttentionConfig mode_config(const std::string& mode) {
  SparseAttentionConfig c;
  c.mode = mode;
  return c;
}

// softmax(q k^T * scale + extras, masked to the layout's blocks) v, in double; rows keeping no
// block give zero.
at::Tensor dense_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& layout, int64_t block, double scale,
                           const AttentionExtras& e, MaskMode kp_mode, MaskMode attn_mode) {
  const int64_t B = q.size(0), T = q.size(2);
  auto additive = [](const at::Tensor& m, MaskMode mode) {
    const at::Tensor d = m.to(at::kDouble);
    return mode == MaskMode::kAdd
               ? d
               : torch::zeros_like(d).masked_fill(d == 0, -std::numeric_limits<double>::infinity());
  };
  const at::Tensor keep = layout.repeat_interleave(block, 1).repeat_interleave(block, 2);
  at::Tensor s = torch::matmul(q.to(at::kDouble), k.to(at::kDouble).transpose(-1, -2)) * scale;
  if (e.rpe.defined()) s = s + e.rpe.to(at::kDouble);
  if (e.key_padding_mask.defined())
    s = s + additive(e.key_padding_mask, kp_mode).view({B, 1, 1, T});
  if (e.attn_mask.defined()) s = s + additive(e.attn_mask, attn_mode);
  const at::Tensor empty_rows = (keep.sum(-1, /*keepdim=*/true) == 0).unsqueeze(0);
  s = s.masked_fill((keep.unsqueeze(0) == 0).logical_and(empty_rows.logical_not()),
                    -std::numeric_limits<double>::infinity());
  const at::Tensor p = torch::softmax(s, -1).masked_fill(empty_rows, 0.0);
  return torch::matmul(p, v.to(at::kDouble));
}

struct Qkv {
  at::Tensor q, k, v;
};

Qkv random_qkv(int64_t B, int64_t H, int64_t T, int64_t D) {
  auto make = [&] { return torch::randn({B, H, T, D}).requires_grad_(true); };
  return {make(), make(), make()};
}

// Our output and q/k/v gradients against the dense reference's.
void expect_matches_dense(const at::Tensor& layout, int64_t block, const AttentionExtras& e = {},
                          MaskMode kp_mode = MaskMode::kAdd, MaskMode attn_mode = MaskMode::kMul) {
  torch::manual_seed(7);
  const int64_t H = layout.size(0), T = layout.size(1) * block;
  Qkv ours = random_qkv(2, H, T, 8);
  Qkv ref{ours.q.detach().clone().requires_grad_(true),
          ours.k.detach().clone().requires_grad_(true),
          ours.v.detach().clone().requires_grad_(true)};
  const double scale = 0.35;
  const at::Tensor out =
      block_sparse_attention(ours.q, ours.k, ours.v, layout, block, scale, e, kp_mode, attn_mode);
  const at::Tensor expected =
      dense_reference(ref.q, ref.k, ref.v, layout, block, scale, e, kp_mode, attn_mode);
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_TRUE(torch::allclose(out.to(at::kDouble), expected, 1e-5, 1e-5))
      << (out.to(at::kDouble) - expected).abs().max();
  const at::Tensor w = torch::randn(out.sizes());
  (out * w).sum().backward();
  (expected * w.to(at::kDouble)).sum().backward();
  EXPECT_TRUE(torch::allclose(ours.q.grad(), ref.q.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(ours.k.grad(), ref.k.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(torch::allclose(ours.v.grad(), ref.v.grad(), 1e-4, 1e-5));
}

TEST(SparsityLayout, FixedBidirectionalByHand) {
  SparseAttentionConfig c = mode_config("fixed");
  c.num_local_blocks = 2;
  c.block = 4;
  // Windows {0,1} {2,3} {4}; the last block of each window (1, 3, and the short window's 4) is
  // global: every row attends to it.
  const at::Tensor expected = torch::tensor({1, 1, 0, 1, 1,  //
                                             1, 1, 0, 1, 1,  //
                                             0, 1, 1, 1, 1,  //
                                             0, 1, 1, 1, 1,  //
                                             0, 1, 0, 1, 1},
                                            at::kLong)
                                  .view({5, 5});
  const at::Tensor layout = SparsityConfig(3, c).make_layout(20);
  ASSERT_EQ(layout.sizes(), (at::IntArrayRef{3, 5, 5}));
  for (int64_t h = 0; h < 3; ++h) EXPECT_TRUE(torch::equal(layout[h], expected)) << layout[h];
}

TEST(SparsityLayout, FixedUnidirectionalByHand) {
  SparseAttentionConfig c = mode_config("fixed");
  c.num_local_blocks = 2;
  c.attention = "unidirectional";
  const at::Tensor expected = torch::tensor({1, 0, 0, 0, 0,  //
                                             1, 1, 0, 0, 0,  //
                                             0, 1, 1, 0, 0,  //
                                             0, 1, 1, 1, 0,  //
                                             0, 1, 0, 1, 1},
                                            at::kLong)
                                  .view({5, 5});
  EXPECT_TRUE(torch::equal(SparsityConfig(1, c).make_layout(80)[0], expected));
}

TEST(SparsityLayout, DifferentGlobalPatternsPerHeadAndSlidingWindows) {
  SparseAttentionConfig c = mode_config("fixed");
  c.num_local_blocks = 2;
  c.different_layout_per_head = true;
  c.num_different_global_patterns = 2;
  const at::Tensor layout = SparsityConfig(2, c).make_layout(64);
  // Head 0's global blocks are each window's last (1, 3), head 1's each window's first (0, 2).
  EXPECT_EQ(layout[0].select(1, 1).sum().item<int64_t>(), 4);
  EXPECT_EQ(layout[1].select(1, 0).sum().item<int64_t>(), 4);
  EXPECT_EQ(layout[1].select(1, 1).sum().item<int64_t>(), 2);  // local only

  SparseAttentionConfig local = mode_config("local");
  local.attention = "unidirectional";
  const at::Tensor l = SparsityConfig(1, local).make_layout(64)[0];
  EXPECT_TRUE(torch::equal(l, torch::tril(torch::ones({4, 4}, at::kLong)) -
                                  torch::tril(torch::ones({4, 4}, at::kLong), -2)));
  EXPECT_TRUE(torch::equal(SparsityConfig(2, mode_config("dense")).make_layout(48),
                           torch::ones({2, 3, 3}, at::kLong)));
}

TEST(SparsityLayout, RandomBlocksFollowTheSeed) {
  SparseAttentionConfig c = mode_config("bigbird");
  c.num_random_blocks = 2;
  const at::Tensor a = SparsityConfig(4, c, 1).make_layout(256);
  EXPECT_TRUE(torch::equal(a, SparsityConfig(4, c, 1).make_layout(256)));
  EXPECT_FALSE(torch::equal(a, SparsityConfig(4, c, 2).make_layout(256)));
  c.different_layout_per_head = true;
  const at::Tensor per_head = SparsityConfig(4, c, 1).make_layout(256);
  EXPECT_FALSE(torch::equal(per_head[0], per_head[1]));
}

TEST(PythonRandomTest, EqualsCPythonsDraws) {
  // Values printed by CPython: random.Random(3).getrandbits(32) three times; Random(42)'s
  // sample(range(8), 3) (the pool path) then sample(range(100), 7) (the set path).
  std::mt19937 r = util::python_random(3);
  EXPECT_EQ(r(), 1022050301U);
  EXPECT_EQ(r(), 2545373330U);
  EXPECT_EQ(r(), 2337446730U);
  std::mt19937 s = util::python_random(42);
  EXPECT_EQ(util::python_sample(s, 8, 3), (std::vector<int64_t>{1, 0, 5}));
  EXPECT_EQ(util::python_sample(s, 100, 7), (std::vector<int64_t>{35, 31, 28, 17, 94, 13, 86}));
  EXPECT_EQ(util::python_random(123456789012LL)(), 1619264890U);  // a two-word seed
}

TEST(BlockSparseAttention, EqualsDenseAttentionMaskedToTheLayout) {
  SparseAttentionConfig fixed = mode_config("fixed");
  fixed.num_local_blocks = 2;
  fixed.block = 4;
  expect_matches_dense(SparsityConfig(3, fixed).make_layout(40), 4);
  fixed.attention = "unidirectional";
  expect_matches_dense(SparsityConfig(3, fixed).make_layout(40), 4);
  // Per-head random layouts: one row table per head, rows of many widths.
  SparseAttentionConfig variable = mode_config("variable");
  variable.num_random_blocks = 2;
  variable.local_window_blocks = {1, 3};
  variable.different_layout_per_head = true;
  variable.block = 4;
  expect_matches_dense(SparsityConfig(3, variable, 5).make_layout(64), 4);
  SparseAttentionConfig dense = mode_config("dense");
  dense.block = 8;
  expect_matches_dense(SparsityConfig(2, dense).make_layout(24), 8);
}

TEST(BlockSparseAttention, AppliesEveryExtraAsDeepSpeedsSoftmax) {
  SparseAttentionConfig c = mode_config("bslongformer");
  c.block = 4;
  const at::Tensor layout = SparsityConfig(2, c).make_layout(32);
  torch::manual_seed(3);
  AttentionExtras e;
  e.rpe = torch::randn({2, 2, 32, 32});
  e.key_padding_mask = torch::zeros({2, 32});
  e.key_padding_mask.index_put_({1, torch::indexing::Slice(28, 32)}, -10000.0);
  e.attn_mask = torch::tril(torch::ones({32, 32}));  // kept where non-zero ("mul")
  expect_matches_dense(layout, 4, e, MaskMode::kAdd, MaskMode::kMul);
  // "mul" key padding (0 removes) and an additive attention mask.
  AttentionExtras m;
  m.key_padding_mask = torch::ones({2, 32});
  m.key_padding_mask.index_put_({0, torch::indexing::Slice(30, 32)}, 0.0);
  m.attn_mask = torch::randn({32, 32});
  expect_matches_dense(layout, 4, m, MaskMode::kMul, MaskMode::kAdd);
}

TEST(BlockSparseAttention, CausalFlagEqualsALowerTriangularMask) {
  SparseAttentionConfig c = mode_config("bigbird");  // blocks above the diagonal too
  c.block = 4;
  c.num_random_blocks = 2;
  const at::Tensor layout = SparsityConfig(2, c, 3).make_layout(48);
  torch::manual_seed(4);
  const Qkv x = random_qkv(2, 2, 48, 8);
  AttentionExtras causal, masked;
  causal.causal = true;
  masked.attn_mask = torch::tril(torch::ones({48, 48}));
  const at::Tensor a = block_sparse_attention(x.q, x.k, x.v, layout, 4, 0.3, causal);
  const at::Tensor b = block_sparse_attention(x.q, x.k, x.v, layout, 4, 0.3, masked);
  EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-6));
  const at::Tensor dense =
      dense_reference(x.q, x.k, x.v, layout, 4, 0.3, masked, MaskMode::kAdd, MaskMode::kMul);
  EXPECT_TRUE(torch::allclose(a.to(at::kDouble), dense, 1e-5, 1e-5));
}

TEST(BlockSparseAttention, ARowKeepingNoBlockHasZeroContext) {
  at::Tensor layout = torch::ones({1, 4, 4}, at::kLong);
  layout[0][2].zero_();
  expect_matches_dense(layout, 2);
  const Qkv x = random_qkv(1, 1, 8, 4);
  const at::Tensor out = block_sparse_attention(x.q, x.k, x.v, layout, 2, 1.0);
  EXPECT_TRUE(torch::equal(out[0][0].slice(0, 4, 6), torch::zeros({2, 4})));
}

TEST(BlockSparseAttention, SixteenBitInputsComputeInFloatAndReturnTheirDtype) {
  SparseAttentionConfig c = mode_config("fixed");
  const at::Tensor layout = SparsityConfig(2, c).make_layout(64);
  torch::manual_seed(1);
  const Qkv x = random_qkv(1, 2, 64, 8);
  const at::Tensor ref = block_sparse_attention(x.q, x.k, x.v, layout, 16, 0.5);
  for (at::ScalarType t : {at::kBFloat16, at::kHalf}) {
    const at::Tensor out = block_sparse_attention(x.q.to(t), x.k.to(t), x.v.to(t), layout, 16, 0.5);
    EXPECT_EQ(out.scalar_type(), t);
    EXPECT_TRUE(torch::allclose(out.to(at::kFloat), ref, 3e-2, 3e-2));
  }
}

TEST(BlockSparseAttention, RefusesShapesItCannotServe) {
  const at::Tensor layout = torch::ones({2, 4, 4}, at::kLong);
  const Qkv x = random_qkv(1, 2, 16, 4);
  EXPECT_THROW_WITH(block_sparse_attention(x.q, x.k, x.v, layout, 3, 1.0), std::invalid_argument,
                    "16 is not a multiple of the block size 3");
  EXPECT_THROW_WITH(block_sparse_attention(x.q, x.k, x.v, layout, 2, 1.0), std::invalid_argument,
                    "the layout must be [heads, 8, 8]");
  const at::Tensor shorter = torch::randn({1, 2, 8, 4});
  EXPECT_THROW_WITH(block_sparse_attention(x.q, shorter, x.v, layout, 4, 1.0),
                    std::invalid_argument, "only self-attention");
}

TEST(SparseSelfAttentionModule, UsesTheLeadingBlocksOfItsRegisteredLayout) {
  SparseAttentionConfig c = mode_config("fixed");
  c.block = 4;
  SparseSelfAttention attn(SparsityConfig(2, c), MaskMode::kAdd, MaskMode::kMul, 64);
  const auto buffers = attn->named_buffers();
  ASSERT_TRUE(buffers.contains("master_layout"));
  EXPECT_EQ(buffers["master_layout"].sizes(), (at::IntArrayRef{2, 16, 16}));
  torch::manual_seed(2);
  const Qkv x = random_qkv(2, 2, 32, 8);
  AttentionExtras e;
  e.attn_mask = torch::tril(torch::ones({32, 32}));
  const at::Tensor out = attn(x.q, x.k, x.v, e);
  const at::Tensor expected = dense_reference(
      x.q, x.k, x.v, attn->layout(32), 4, 1.0 / std::sqrt(8.0), e, MaskMode::kAdd, MaskMode::kMul);
  EXPECT_TRUE(torch::allclose(out.to(at::kDouble), expected, 1e-5, 1e-5));
  // Keys already transposed, and the module cast to 16 bits (its integer buffer too).
  EXPECT_TRUE(torch::allclose(attn(x.q, x.k.transpose(2, 3), x.v, e), out));
  // One plan per length, kept until the layout changes.
  const BlockSparsePlan* kept = &attn->plan(32);
  EXPECT_EQ(&attn->plan(32), kept);
  EXPECT_EQ(attn->plan(32, 1).heads(), 1);
  attn->master_layout.slice(2, 1).zero_();  // a loaded layout: only column block 0 is kept
  const at::Tensor first_only = attn(x.q, x.k, x.v, e);
  EXPECT_TRUE(torch::allclose(first_only.slice(2, 0, 4), out.slice(2, 0, 4)));
  EXPECT_FALSE(torch::allclose(first_only.slice(2, 4), out.slice(2, 4)));
  attn->master_layout.copy_(SparsityConfig(2, c).make_layout(64));
  attn->to(at::kBFloat16);
  EXPECT_TRUE(torch::equal(attn->layout(32), SparsityConfig(2, c).make_layout(32)));
  EXPECT_THROW_WITH(
      attn(torch::randn({1, 2, 68, 8}), torch::randn({1, 2, 68, 8}), torch::randn({1, 2, 68, 8})),
      std::invalid_argument, "exceed max_seq_length 64");
}

TEST(SparseSelfAttentionModule, BertLayerPadsAndUnpads) {
  SparseAttentionConfig c = mode_config("fixed");
  c.block = 4;
  BertSparseSelfAttention bert(16, 2, SparsityConfig(2, c));
  const at::Tensor ids = torch::randint(0, 50, {2, 10}, at::kLong);
  const PaddedInputs padded =
      pad_to_block_size(4, ids, torch::ones({2, 10}, at::kLong), torch::zeros({2, 10}, at::kLong),
                        at::Tensor(), /*pad_token_id=*/0);
  ASSERT_EQ(padded.pad_len, 2);
  EXPECT_EQ(padded.input_ids.sizes(), (at::IntArrayRef{2, 12}));
  EXPECT_EQ(padded.attention_mask.slice(1, 10).sum().item<int64_t>(), 0);
  EXPECT_FALSE(padded.position_ids.defined());
  const at::Tensor hidden = torch::randn({2, 12, 16});
  // BERT's extended mask: 0 to keep, -10000 on the padding.
  const at::Tensor mask = (1.0 - padded.attention_mask.to(at::kFloat)) * -10000.0;
  const at::Tensor out = bert(hidden, mask);
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{2, 12, 16}));
  EXPECT_EQ(unpad_sequence_output(padded.pad_len, out).sizes(), (at::IntArrayRef{2, 10, 16}));
  EXPECT_TRUE(bert->named_parameters().contains("query.weight"));
}

std::optional<SparseAttentionConfig> parse(const std::string& text) {
  return read_sparse_attention_config(json::parse(text), "cfg.json");
}

TEST(SparseAttentionConfigTest, DefaultsAndKeysOfTheMode) {
  EXPECT_FALSE(parse("{}").has_value());
  const auto fixed = parse(R"({"sparse_attention": {}})");
  ASSERT_TRUE(fixed.has_value());
  EXPECT_EQ(fixed->mode, "fixed");
  EXPECT_EQ(fixed->block, 16);
  EXPECT_EQ(fixed->num_local_blocks, 4);
  const auto bigbird = parse(R"({"sparse_attention": {"mode": "bigbird", "block": 32,
      "num_random_blocks": 2, "attention": "unidirectional"}})");
  EXPECT_EQ(bigbird->num_random_blocks, 2);
  EXPECT_EQ(bigbird->attention, "unidirectional");  // DeepSpeed's reader drops it
  const auto variable = parse(R"({"sparse_attention": {"mode": "variable",
      "local_window_blocks": [2, 3], "global_block_indices": [0, 4],
      "global_block_end_indices": [2, 6]}})");
  EXPECT_EQ(variable->local_window_blocks, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(*variable->global_block_end_indices, (std::vector<int64_t>{2, 6}));
  // Through DeepSpeedConfig: the section no longer refuses the config.
  const DeepSpeedConfig ds = DeepSpeedConfig::from_json(
      json::parse(R"({"train_batch_size": 2, "sparse_attention": {"mode": "dense"}})"), 1);
  ds.check_supported();
  EXPECT_EQ(sparse_attention_config(ds)->mode, "dense");
}

TEST(SparseAttentionConfigTest, ErrorsAndWarningsNameTheKey) {
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"mode": "strided"}})"), ConfigError,
                    "sparse_attention.mode is \"strided\"; expected one of");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"num_local_block": 4}})"), ConfigError,
                    "did you mean 'num_local_blocks'");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"num_local_blocks": 3,
                      "num_global_blocks": 2}})"),
                    ConfigError, "sparse_attention.num_local_blocks (3) must be divisible");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"num_different_global_patterns": 2}})"),
                    ConfigError, "needs different_layout_per_head true");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"attention": "causal"}})"), ConfigError,
                    "sparse_attention.attention is \"causal\"");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"mode": "variable",
                      "attention": "unidirectional", "horizontal_global_attention": true}})"),
                    ConfigError, "horizontal_global_attention is true");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"mode": "bslongformer",
                      "global_block_indices": [0, 3], "global_block_end_indices": [2]}})"),
                    ConfigError, "has 1 entries for 2 global_block_indices");
  EXPECT_THROW_WITH(parse(R"({"sparse_attention": {"mode": "dense", "block": "16"}})"), ConfigError,
                    "sparse_attention.block");
  // A key of another mode: DeepSpeed ignores it; here it is named.
  const DeepSpeedConfig ds = DeepSpeedConfig::from_json(
      json::parse(
          R"({"train_batch_size": 2, "sparse_attention": {"mode": "bigbird",
          "num_local_blocks": 4}})"),
      1);
  bool warned = false;
  for (const auto& w : ds.warnings) {
    warned = warned || w.find(
                           "sparse_attention.num_local_blocks is not used by mode "
                           "\"bigbird\"") != std::string::npos;
  }
  EXPECT_TRUE(warned);
  EXPECT_THROW_WITH(SparsityConfig(2, mode_config("strided")), std::invalid_argument,
                    "sparse_attention.mode is \"strided\"");
  SparseAttentionConfig too_many = mode_config("bigbird");
  too_many.num_random_blocks = 5;
  EXPECT_THROW_WITH(SparsityConfig(1, too_many).make_layout(64), std::invalid_argument,
                    "num_random_blocks (5) must not exceed the blocks in a row (4)");
}

}  // namespace
}  // namespace deepspeed::sparse_attention

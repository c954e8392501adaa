// Block-sparse attention as batched matrix products. For each head and row block of queries,
// the key and value blocks its layout row keeps are gathered side by side (rows with fewer
// blocks padded, the padding removed from the softmax), so that one batched product gives the
// scores of every kept block, one softmax normalises each query over its row's blocks, and one
// batched product with the gathered values gives the context. The rows are grouped by how many
// blocks they keep, each group padded to its own widest row, so that a causal layout (whose
// rows widen along the sequence) pays little for the padding.
#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepspeed/sparse_attention.h"

namespace deepspeed::sparse_attention {
namespace detail {

// The kept column blocks of a group of row blocks, per head (or one set for all heads when
// every head has the same layout).
struct RowGroup {
  at::Tensor rows;     // [R] int64: the group's row blocks
  at::Tensor cols;     // [H', R, K] int64: kept column blocks, padded with block 0
  at::Tensor padding;  // [H', R, K] bool: true on the padding of rows that keep a block
  at::Tensor empty;    // [H', R] bool: rows that keep no block (their context is zero)
  bool has_empty_row = false;
};

struct PlanTables {
  std::vector<RowGroup> groups;
  at::Tensor inverse;  // [n] int64: from the groups' row order back to the sequence's
};

}  // namespace detail
namespace {

using at::indexing::Slice;
using detail::RowGroup;

// Rows grouped by width: at most this many groups.
constexpr int64_t kMaxRowGroups = 4;

bool heads_share_layout(const at::Tensor& layout) {
  return layout.size(0) == 1 || at::equal(layout, layout[0].expand_as(layout));
}

std::vector<RowGroup> group_rows(const at::Tensor& layout) {
  const bool shared = heads_share_layout(layout);
  const at::Tensor l = shared ? layout.slice(0, 0, 1) : layout;
  const int64_t H = l.size(0), n = l.size(1);
  const auto a = l.accessor<int64_t, 3>();
  // A row's width: the most blocks it keeps over the heads.
  std::vector<int64_t> width(n, 0);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t h = 0; h < H; ++h) {
      int64_t count = 0;
      for (int64_t c = 0; c < n; ++c) count += a[h][r][c] != 0;
      width[r] = std::max(width[r], count);
    }
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t x, int64_t y) { return width[x] < width[y]; });
  const int64_t groups = std::min<int64_t>(kMaxRowGroups, n);
  std::vector<RowGroup> out;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t begin = g * n / groups, end = (g + 1) * n / groups;
    if (begin == end) continue;
    const int64_t R = end - begin, K = std::max<int64_t>(1, width[order[end - 1]]);
    RowGroup group;
    group.rows = at::empty({R}, at::kLong);
    group.cols = at::zeros({H, R, K}, at::kLong);
    at::Tensor valid = at::zeros({H, R, K}, at::kBool);
    group.empty = at::zeros({H, R}, at::kBool);
    auto rows = group.rows.accessor<int64_t, 1>();
    auto cols = group.cols.accessor<int64_t, 3>();
    auto kept = valid.accessor<bool, 3>();
    auto empty = group.empty.accessor<bool, 2>();
    for (int64_t i = 0; i < R; ++i) {
      const int64_t r = order[begin + i];
      rows[i] = r;
      for (int64_t h = 0; h < H; ++h) {
        int64_t j = 0;
        for (int64_t c = 0; c < n; ++c) {
          if (a[h][r][c] == 0) continue;
          cols[h][i][j] = c;
          kept[h][i][j] = true;
          ++j;
        }
        empty[h][i] = j == 0;
        group.has_empty_row = group.has_empty_row || j == 0;
      }
    }
    // A row keeping no block keeps finite scores (its probabilities are zeroed after the
    // softmax), so that no NaN reaches the gradients.
    group.padding = valid.logical_not().logical_and(group.empty.logical_not().unsqueeze(-1));
    out.push_back(std::move(group));
  }
  return out;
}

at::Tensor mask_to_additive(const at::Tensor& m, MaskMode mode) {
  const at::Tensor f = m.to(at::kFloat);
  if (mode == MaskMode::kAdd) return f;
  return at::zeros_like(f).masked_fill(f == 0, -std::numeric_limits<float>::infinity());
}

// [B, H, n, blk, D] blocks -> each group row's kept blocks side by side: [B, H, R, K*blk, D].
at::Tensor gather_blocks(const at::Tensor& x5, const at::Tensor& cols) {
  const int64_t B = x5.size(0), H = x5.size(1), blk = x5.size(3), D = x5.size(4);
  const int64_t R = cols.size(1), K = cols.size(2);
  if (cols.size(0) == 1) {  // one table for every head: whole blocks picked along the sequence
    return x5.index_select(2, cols.reshape({R * K})).view({B, H, R, K * blk, D});
  }
  const at::Tensor flat = x5.reshape({B, H, x5.size(2), blk * D});
  const at::Tensor index = cols.reshape({1, cols.size(0), R * K, 1}).expand({B, H, R * K, blk * D});
  return at::gather(flat, 2, index).view({B, H, R, K * blk, D});
}

// What the padding and the extras add to a group's scores [B, H, R, blk, K*blk] (in fp32).
at::Tensor group_bias(const RowGroup& g, const AttentionExtras& e, int64_t B, int64_t H, int64_t n,
                      int64_t blk, MaskMode kp_mode, MaskMode attn_mode) {
  const at::Tensor& cols = g.cols;
  const at::Tensor& rows = g.rows;
  const int64_t Hg = cols.size(0), R = cols.size(1), K = cols.size(2);
  const float inf = std::numeric_limits<float>::infinity();
  // Padding: [1, H', R, 1, K*blk].
  at::Tensor bias = at::zeros({Hg, R, K}, cols.options().dtype(at::kFloat))
                        .masked_fill(g.padding, -inf)
                        .view({1, Hg, R, 1, K, 1})
                        .expand({1, Hg, R, 1, K, blk})
                        .reshape({1, Hg, R, 1, K * blk});
  if (e.key_padding_mask.defined()) {
    const at::Tensor kp = mask_to_additive(e.key_padding_mask.reshape({B, n, blk}), kp_mode);
    // kp[b, cols[h, r, j], :] -> [B, H', R, 1, K*blk]
    bias = bias + kp.index({Slice(), cols}).view({B, Hg, R, 1, K * blk});
  }
  if (e.attn_mask.defined()) {
    const at::Tensor m = mask_to_additive(e.attn_mask, attn_mode);
    // Blocks [row block, column block, blk, blk], picked per (head, group row, slot).
    const at::Tensor m4 = m.view({n, blk, n, blk}).permute({0, 2, 1, 3});
    const at::Tensor picked = m4.index({rows.view({1, R, 1}), cols});  // [H', R, K, blk, blk]
    bias = bias + picked.permute({0, 1, 3, 2, 4}).reshape({1, Hg, R, blk, K * blk});
  }
  if (e.causal) {
    // Token positions: the group's queries [1, R, blk, 1] and its slots' keys [H', R, 1, K*blk].
    const at::Tensor within = at::arange(blk, rows.options());
    const at::Tensor q_pos = (rows.view({R, 1}) * blk + within).view({1, R, blk, 1});
    const at::Tensor k_pos = (cols.unsqueeze(-1) * blk + within).view({Hg, R, 1, K * blk});
    bias = bias.masked_fill((k_pos > q_pos).unsqueeze(0), -inf);
  }
  if (e.rpe.defined()) {
    const at::Tensor rpe = e.rpe.to(at::kFloat);
    const int64_t Z = rpe.size(0);
    const at::Tensor r6 = rpe.view({Z, H, n, blk, n, blk}).permute({0, 1, 2, 4, 3, 5});
    const at::Tensor heads = at::arange(H, cols.options()).view({H, 1, 1});
    const at::Tensor picked =
        r6.index({Slice(), heads, rows.view({1, R, 1}), cols.expand({H, R, K})});
    bias = bias + picked.permute({0, 1, 2, 4, 3, 5}).reshape({Z, H, R, blk, K * blk});
  }
  return bias;
}

void check_inputs(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const BlockSparsePlan& plan, int64_t block) {
  if (q.dim() != 4) {
    const std::string dims = std::to_string(q.dim());
    throw std::invalid_argument("sparse attention: query must be [batch, heads, tokens, "
                                "head_dim]; it has " + dims + " dimensions");
  }
  if (!q.sizes().equals(k.sizes()) || !k.sizes().equals(v.sizes())) {
    throw std::invalid_argument("sparse attention: only self-attention is supported "
                                "(query, key and value of one shape)");
  }
  const int64_t T = q.size(2);
  if (block < 1 || T % block != 0) {
    throw std::invalid_argument("sparse attention: the sequence length " + std::to_string(T) +
                                " is not a multiple of the block size " + std::to_string(block));
  }
  const int64_t n = T / block;
  if (plan.heads() != q.size(1) || plan.blocks() != n) {
    throw std::invalid_argument("sparse attention: the layout must be [heads, " +
                                std::to_string(n) + ", " + std::to_string(n) + "] for " +
                                std::to_string(q.size(1)) + " heads and " + std::to_string(T) +
                                " tokens in blocks of " + std::to_string(block));
  }
}

}  // namespace

BlockSparsePlan::BlockSparsePlan(const at::Tensor& layout_in, std::optional<at::Device> device) {
  if (layout_in.dim() != 3 || layout_in.size(1) != layout_in.size(2)) {
    throw std::invalid_argument("sparse attention: a layout is [heads, blocks, blocks]");
  }
  const at::Tensor layout = layout_in.to(at::kCPU, at::kLong).contiguous();
  heads_ = layout.size(0);
  blocks_ = layout.size(1);
  // The tables live where the forwards run: there a forward copies nothing.
  const at::Device on = device.value_or(layout_in.device());
  detail::PlanTables tables;
  tables.groups = group_rows(layout);
  std::vector<at::Tensor> rows;
  for (RowGroup& g : tables.groups) {
    for (at::Tensor* t : {&g.rows, &g.cols, &g.padding, &g.empty}) *t = t->to(on);
    rows.push_back(g.rows);
  }
  tables.inverse = at::argsort(at::cat(rows));
  tables_ = std::make_shared<const detail::PlanTables>(std::move(tables));
}

at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& layout, int64_t block, double scale,
                                  const AttentionExtras& extras, MaskMode key_padding_mask_mode,
                                  MaskMode attn_mask_mode) {
  return block_sparse_attention(q, k, v, BlockSparsePlan(layout, q.device()), block, scale, extras,
                                key_padding_mask_mode, attn_mask_mode);
}

at::Tensor block_sparse_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const BlockSparsePlan& plan, int64_t block, double scale,
                                  const AttentionExtras& extras, MaskMode key_padding_mask_mode,
                                  MaskMode attn_mask_mode) {
  check_inputs(q, k, v, plan, block);
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), D = q.size(3), n = T / block;
  // The products run in the inputs' dtype on GPUs (which accumulate 16-bit products in fp32)
  // and in fp32 on CPUs (whose 16-bit GEMMs may accumulate in 16 bits); the softmax in fp32.
  const at::ScalarType compute = q.is_cuda() ? q.scalar_type() : at::kFloat;
  const at::Tensor q5 = q.to(compute).reshape({B, H, n, block, D});
  const at::Tensor k5 = k.to(compute).reshape({B, H, n, block, D});
  const at::Tensor v5 = v.to(compute).reshape({B, H, n, block, D});

  std::vector<at::Tensor> contexts;
  const at::Device device = q.device();
  for (RowGroup g : plan.tables().groups) {
    // No copies where the plan was made for this device.
    for (at::Tensor* t : {&g.rows, &g.cols, &g.padding, &g.empty}) *t = t->to(device);
    const at::Tensor& cols = g.cols;
    const at::Tensor& rows = g.rows;
    // The scale goes into the queries (a pass over them, not over the scores).
    const at::Tensor qg = q5.index_select(2, rows) * scale;  // [B, H, R, blk, D]
    const at::Tensor kg = gather_blocks(k5, cols);           // [B, H, R, K*blk, D]
    const at::Tensor vg = gather_blocks(v5, cols);
    at::Tensor scores = at::matmul(qg, kg.transpose(-1, -2)).to(at::kFloat);
    // In place: the product's backward needs its inputs, not its output.
    scores.add_(group_bias(g, extras, B, H, n, block, key_padding_mask_mode, attn_mask_mode));
    at::Tensor probs = at::softmax(scores, -1);
    if (g.has_empty_row) {  // rows keeping no block attend to nothing: zero context
      probs = probs.masked_fill(g.empty.view({1, -1, g.empty.size(1), 1, 1}), 0.0);
    }
    contexts.push_back(at::matmul(probs.to(compute), vg));  // [B, H, R, blk, D]
  }
  // Back in row order.
  const at::Tensor context = at::cat(contexts, 2);
  return context.index_select(2, plan.tables().inverse.to(device))
      .reshape({B, H, T, D})
      .to(q.scalar_type());
}

}  // namespace deepspeed::sparse_attention

// The block layouts of DeepSpeed's SparsityConfig classes, block for block and, for the random
// blocks, draw for draw (Python's random.sample from the same seed).
#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "deepspeed/sparse_attention.h"
#include "util/python_random.h"

namespace deepspeed::sparse_attention {
namespace {

// One head's layout, filled as DeepSpeed fills layout[h].
class HeadLayout {
 public:
  explicit HeadLayout(int64_t n) : n_(n), cells_(static_cast<size_t>(n * n), 0) {}
  int64_t size() const { return n_; }
  void set(int64_t row, int64_t col) { cells_[row * n_ + col] = 1; }
  // layout[h, r0:r1, c0:c1] = 1, with Python's clamping of slice ends.
  void fill(int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    r1 = std::min(r1, n_);
    c1 = std::min(c1, n_);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) set(r, c);
    }
  }
  void keep_lower_triangle() {  // torch.tril
    for (int64_t r = 0; r < n_; ++r) {
      for (int64_t c = r + 1; c < n_; ++c) cells_[r * n_ + c] = 0;
    }
  }
  const std::vector<int64_t>& cells() const { return cells_; }

 private:
  int64_t n_;
  std::vector<int64_t> cells_;
};

bool unidirectional(const SparseAttentionConfig& c) { return c.attention == "unidirectional"; }

void fixed_local(const SparseAttentionConfig& c, HeadLayout& l) {
  const int64_t n = l.size();
  for (int64_t i = 0; i < n; i += c.num_local_blocks) {
    const int64_t end = std::min(i + c.num_local_blocks, n);
    for (int64_t row = i; row < end; ++row)
      l.fill(row, row + 1, i, unidirectional(c) ? row + 1 : end);
  }
}

void fixed_global(const SparseAttentionConfig& c, int64_t h, HeadLayout& l) {
  const int64_t n = l.size();
  const int64_t first =
      c.num_local_blocks - (1 + h % c.num_different_global_patterns) * c.num_global_blocks;
  // Every window's global blocks but a short last window's.
  int64_t end = n - n % c.num_local_blocks;
  for (int64_t i = first; i < end; i += c.num_local_blocks) {
    l.fill(unidirectional(c) ? i : 0, n, i, i + c.num_global_blocks);
    if (c.horizontal_global_attention) l.fill(i, i + c.num_global_blocks, 0, n);
  }
  if (end < n) {  // the short last window
    const int64_t start = std::max<int64_t>(0, std::min(end + first, n - c.num_global_blocks));
    end = start + c.num_global_blocks;
    l.fill(unidirectional(c) ? start : 0, n, start, end);
    if (c.horizontal_global_attention) l.fill(start, end, 0, n);
  }
}

void random_blocks(const SparseAttentionConfig& c, std::mt19937& rng, bool causal_range,
                   HeadLayout& l) {
  const int64_t n = l.size();
  if (n < c.num_random_blocks) {
    throw std::invalid_argument(
        "sparse_attention.num_random_blocks (" + std::to_string(c.num_random_blocks) +
        ") must not exceed the blocks in a row (" + std::to_string(n) + ")");
  }
  for (int64_t row = 0; row < n; ++row) {
    // BigBird's unidirectional draw is from the row's past only; DeepSpeed's random.sample
    // fails on rows with fewer blocks than it asks for, here such a row takes all it has.
    const int64_t range = causal_range ? row + 1 : n;
    for (int64_t col : util::python_sample(rng, range, std::min(range, c.num_random_blocks))) {
      l.set(row, col);
    }
  }
}

void variable_local(const SparseAttentionConfig& c, HeadLayout& l) {
  const int64_t n = l.size();
  int64_t start = 0, end = 0, window = 0;
  auto window_at = [&](int64_t from, int64_t to) {
    for (int64_t row = from; row < to; ++row) {
      l.fill(row, row + 1, from, unidirectional(c) ? row + 1 : to);
    }
  };
  for (int64_t w : c.local_window_blocks) {
    window = w;
    end = std::min(end + w, n);
    window_at(start, end);
    start += w;
  }
  // The rest of the sequence in windows of the last size.
  for (int64_t i = start; i < n; i += window) window_at(i, std::min(i + window, n));
}

// Variable's and BSLongformer's global blocks: columns (from the block's row on under
// unidirectional attention) and, when `rows`, the blocks' rows too.
void indexed_global(const SparseAttentionConfig& c, bool rows, bool causal_first_row,
                    HeadLayout& l) {
  const int64_t n = l.size();
  for (size_t i = 0; i < c.global_block_indices.size(); ++i) {
    const int64_t start = c.global_block_indices[i];
    if (start >= n) continue;
    const int64_t end =
        c.global_block_end_indices ? std::min((*c.global_block_end_indices)[i], n) : start + 1;
    if (rows) l.fill(start, end, 0, n);
    l.fill(causal_first_row ? start : 0, n, start, end);
  }
}

void sliding_window(const SparseAttentionConfig& c, bool causal, HeadLayout& l) {
  const int64_t n = l.size();
  if (n < c.num_sliding_window_blocks) {
    throw std::invalid_argument("sparse_attention.num_sliding_window_blocks (" +
                                std::to_string(c.num_sliding_window_blocks) +
                                ") must not exceed the blocks in a row (" + std::to_string(n) +
                                ")");
  }
  const int64_t w = c.num_sliding_window_blocks / 2;
  for (int64_t row = 0; row < n; ++row) {
    l.fill(row, row + 1, std::max<int64_t>(0, row - w), causal ? row + 1 : row + w + 1);
  }
}

HeadLayout head_layout(const SparseAttentionConfig& c, int64_t h, int64_t n, std::mt19937& rng) {
  HeadLayout l(n);
  const std::string& m = c.mode;
  if (m == "dense") {
    l.fill(0, n, 0, n);
  } else if (m == "fixed") {
    fixed_local(c, l);
    fixed_global(c, h, l);
  } else if (m == "variable") {
    random_blocks(c, rng, /*causal_range=*/false, l);
    variable_local(c, l);
    indexed_global(c, c.horizontal_global_attention, unidirectional(c), l);
  } else if (m == "bigbird") {
    random_blocks(c, rng, unidirectional(c), l);
    sliding_window(c, /*causal=*/false, l);
    if (n < c.num_global_blocks) {
      throw std::invalid_argument(
          "sparse_attention.num_global_blocks (" + std::to_string(c.num_global_blocks) +
          ") must not exceed the blocks in a row (" + std::to_string(n) + ")");
    }
    l.fill(0, c.num_global_blocks, 0, n);
    l.fill(0, n, 0, c.num_global_blocks);
    if (unidirectional(c)) l.keep_lower_triangle();
  } else if (m == "bslongformer") {
    sliding_window(c, /*causal=*/false, l);
    indexed_global(c, /*rows=*/true, /*causal_first_row=*/false, l);
    if (unidirectional(c)) l.keep_lower_triangle();
  } else {  // local
    sliding_window(c, unidirectional(c), l);
  }
  return l;
}

}  // namespace

SparsityConfig::SparsityConfig(int64_t num_heads, SparseAttentionConfig config, int64_t seed)
    : num_heads_(num_heads), config_(std::move(config)), seed_(seed) {
  if (num_heads < 1) {
    throw std::invalid_argument("SparsityConfig: num_heads is " + std::to_string(num_heads) +
                                "; expected at least 1");
  }
  if (auto problem = check_sparsity(config_)) {
    throw std::invalid_argument("sparse_attention." + problem->key + " " + problem->message);
  }
}

at::Tensor SparsityConfig::make_layout(int64_t seq_len) const {
  if (seq_len % config_.block != 0) {
    throw std::invalid_argument("sparse attention: the sequence length " + std::to_string(seq_len) +
                                " is not a multiple of the block size " +
                                std::to_string(config_.block));
  }
  const int64_t n = seq_len / config_.block;
  std::mt19937 rng = util::python_random(seed_);
  // DeepSpeed fills one layout, or one per head, and copies head 0's to the rest.
  const int64_t distinct = config_.different_layout_per_head ? num_heads_ : 1;
  at::Tensor layout = at::zeros({num_heads_, n, n}, at::kLong);
  for (int64_t h = 0; h < distinct; ++h) {
    const HeadLayout l = head_layout(config_, h, n, rng);
    layout[h].copy_(at::tensor(l.cells(), at::kLong).view({n, n}));
  }
  if (distinct == 1 && num_heads_ > 1)
    layout.slice(0, 1).copy_(layout[0].expand({num_heads_ - 1, n, n}));
  return layout;
}

}  // namespace deepspeed::sparse_attention

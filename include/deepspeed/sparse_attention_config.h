// sparse_attention as read from ds_config.json (torch-free: the launcher's config reader compiles
// it too): DeepSpeed's block-sparse attention patterns, one mode with its keys. What uses it:
// sparse_attention.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "deepspeed/config.h"

namespace deepspeed::sparse_attention {

/// One sparsity pattern: DeepSpeed's SparsityConfig classes in one struct, `mode` choosing which
/// keys apply. Defaults are those of DeepSpeed's config reader (runtime/config.py), which for
/// bigbird's num_random_blocks (0) differ from its class's (1).
struct SparseAttentionConfig {
  /// "dense" | "fixed" | "variable" | "bigbird" | "bslongformer" (ds_config), or "local"
  /// (DeepSpeed's LocalSlidingWindowSparsityConfig, which its config reader lacks: C++ only).
  std::string mode = "fixed";
  int64_t block = 16;
  bool different_layout_per_head = false;
  /// "bidirectional" | "unidirectional" (fixed, variable, bigbird, bslongformer, local).
  std::string attention = "bidirectional";
  // fixed
  int64_t num_local_blocks = 4;
  int64_t num_global_blocks = 1;  // and bigbird
  bool horizontal_global_attention = false;  // and variable
  int64_t num_different_global_patterns = 1;
  // variable, bigbird
  int64_t num_random_blocks = 0;
  // variable
  std::vector<int64_t> local_window_blocks{4};
  std::vector<int64_t> global_block_indices{0};  // and bslongformer
  std::optional<std::vector<int64_t>> global_block_end_indices;  // and bslongformer
  // bigbird, bslongformer, local
  int64_t num_sliding_window_blocks = 3;
};

/// A configuration DeepSpeed's SparsityConfig constructors would refuse: the key and why.
struct SparsityProblem {
  std::string key;
  std::string message;
};

/// DeepSpeed's constructor checks (and a block, window and global count of at least 1, which it
/// would fail on later); nullopt when `c` is valid.
std::optional<SparsityProblem> check_sparsity(const SparseAttentionConfig& c);

/// The sparse_attention section of `config` (nullopt when absent: dense attention).
std::optional<SparseAttentionConfig> sparse_attention_config(const DeepSpeedConfig& config);

/// The same from a whole ds_config object; errors name `source` and the key.
std::optional<SparseAttentionConfig> read_sparse_attention_config(const json& ds_config,
                                                                  const std::string& source);

/// The same from initialize()'s config argument (a file path, JSON text or base64 of JSON),
/// for a model built before the engine's config is (a pipeline's stages, say).
std::optional<SparseAttentionConfig> read_sparse_attention_config(const std::string& config);

}  // namespace deepspeed::sparse_attention

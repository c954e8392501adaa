// sparse_attention (DeepSpeed's runtime/config.py get_sparse_attention): the mode and the keys
// DeepSpeed reads for it, with its defaults, and its SparsityConfig constructor checks as errors
// naming the key, at config load rather than when the model builds its attention. DeepSpeed
// ignores the keys of other modes; here they are warned about by name. Beyond DeepSpeed, which
// drops it, bigbird and bslongformer honour "attention" (their classes take it).
#include <algorithm>
#include <iterator>

#include "config/config_source.h"
#include "config/feature_sections.h"
#include "deepspeed/sparse_attention_config.h"

namespace deepspeed::config_detail {
namespace {

using sparse_attention::SparseAttentionConfig;

constexpr const char* kModes[] = {"dense", "fixed", "variable", "bigbird", "bslongformer"};

// The keys each mode reads, after "mode" and "block".
std::vector<std::string> mode_keys(const std::string& mode) {
  if (mode == "fixed") {
    return {"different_layout_per_head", "num_local_blocks", "num_global_blocks", "attention",
            "horizontal_global_attention", "num_different_global_patterns"};
  }
  if (mode == "variable") {
    return {"different_layout_per_head", "num_random_blocks", "local_window_blocks",
            "global_block_indices", "global_block_end_indices", "attention",
            "horizontal_global_attention"};
  }
  if (mode == "bigbird") {
    return {"different_layout_per_head", "num_random_blocks", "num_sliding_window_blocks",
            "num_global_blocks", "attention"};
  }
  if (mode == "bslongformer") {
    return {"different_layout_per_head", "num_sliding_window_blocks", "global_block_indices",
            "global_block_end_indices", "attention"};
  }
  return {};  // dense
}

void read_mode_keys(ConfigReader& r, SparseAttentionConfig& c) {
  const std::vector<std::string> keys = mode_keys(c.mode);
  auto reads = [&](const char* key) {
    return std::find(keys.begin(), keys.end(), key) != keys.end();
  };
  if (reads("different_layout_per_head")) {
    c.different_layout_per_head = r.get_bool("different_layout_per_head", false);
  }
  if (reads("attention")) c.attention = r.get_string("attention", c.attention);
  if (reads("num_local_blocks")) c.num_local_blocks = r.get_int("num_local_blocks", 4);
  if (reads("num_global_blocks")) c.num_global_blocks = r.get_int("num_global_blocks", 1);
  if (reads("horizontal_global_attention")) {
    c.horizontal_global_attention = r.get_bool("horizontal_global_attention", false);
  }
  if (reads("num_different_global_patterns")) {
    c.num_different_global_patterns = r.get_int("num_different_global_patterns", 1);
  }
  if (reads("num_random_blocks")) c.num_random_blocks = r.get_int("num_random_blocks", 0, 0);
  if (reads("local_window_blocks") && r.has("local_window_blocks")) {
    c.local_window_blocks = r.get_int_list("local_window_blocks");
  }
  if (reads("global_block_indices") && r.has("global_block_indices")) {
    c.global_block_indices = r.get_int_list("global_block_indices", 0);
  }
  if (reads("global_block_end_indices") && r.get_raw("global_block_end_indices") != nullptr) {
    c.global_block_end_indices = r.get_int_list("global_block_end_indices", 0);
  }
  if (reads("num_sliding_window_blocks")) {
    c.num_sliding_window_blocks = r.get_int("num_sliding_window_blocks", 3);
  }
}

}  // namespace

std::optional<SparseAttentionConfig> read_sparse_attention(ConfigReader& top) {
  ConfigReader r = top.section("sparse_attention", Strictness::kStrict);
  if (!r.present()) return std::nullopt;
  SparseAttentionConfig c;
  c.mode = r.get_string("mode", "fixed");
  if (std::find(std::begin(kModes), std::end(kModes), c.mode) == std::end(kModes)) {
    r.fail("mode", "is \"" + c.mode + "\"; expected one of \"dense\", \"fixed\", \"variable\", "
                                      "\"bigbird\", \"bslongformer\" (DeepSpeed's modes)");
  }
  c.block = r.get_int("block", 16);
  read_mode_keys(r, c);
  if (auto problem = sparse_attention::check_sparsity(c)) r.fail(problem->key, problem->message);
  // Keys of the other modes: DeepSpeed reads none of them in this mode.
  std::vector<std::string> others;
  for (const char* mode : kModes) {
    for (const std::string& key : mode_keys(mode)) {
      const std::vector<std::string> mine = mode_keys(c.mode);
      if (std::find(mine.begin(), mine.end(), key) != mine.end() || !r.has(key)) continue;
      if (std::find(others.begin(), others.end(), key) != others.end()) continue;
      others.push_back(key);
      r.mark_known(key);
      r.warn(key, "is not used by mode \"" + c.mode +
                      "\" (DeepSpeed reads it only in other modes); it is ignored");
    }
  }
  r.finish();
  return c;
}

}  // namespace deepspeed::config_detail

namespace deepspeed::sparse_attention {
namespace {

std::optional<SparsityProblem> check_global_ends(const SparseAttentionConfig& c) {
  if (!c.global_block_end_indices) return std::nullopt;
  const auto& starts = c.global_block_indices;
  const auto& ends = *c.global_block_end_indices;
  if (starts.size() != ends.size()) {
    return SparsityProblem{"global_block_end_indices",
                           "has " + std::to_string(ends.size()) + " entries for " +
                               std::to_string(starts.size()) +
                               " global_block_indices; expected one end per start"};
  }
  for (size_t i = 0; i < starts.size(); ++i) {
    if (starts[i] >= ends[i]) {
      return SparsityProblem{"global_block_end_indices",
                             "entry " + std::to_string(i) + " (" + std::to_string(ends[i]) +
                                 ") is not above its start " + std::to_string(starts[i])};
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<SparsityProblem> check_sparsity(const SparseAttentionConfig& c) {
  const std::string& m = c.mode;
  if (m != "dense" && m != "fixed" && m != "variable" && m != "bigbird" && m != "bslongformer" &&
      m != "local") {
    return SparsityProblem{"mode", "is \"" + m + "\"; it has not been implemented"};
  }
  if (c.block < 1) return SparsityProblem{"block", "is " + std::to_string(c.block) +
                                                       "; expected at least 1"};
  if (m == "dense") return std::nullopt;
  if (c.attention != "unidirectional" && c.attention != "bidirectional") {
    return SparsityProblem{"attention", "is \"" + c.attention +
                                            "\"; only \"unidirectional\" and \"bidirectional\" "
                                            "attention are supported"};
  }
  if (c.horizontal_global_attention && c.attention != "bidirectional" &&
      (m == "fixed" || m == "variable")) {
    return SparsityProblem{"horizontal_global_attention",
                           "is true; only bidirectional attention can have horizontal global "
                           "attention"};
  }
  if (m == "fixed") {
    if (c.num_local_blocks < 1 || c.num_global_blocks < 1) {
      return SparsityProblem{c.num_local_blocks < 1 ? "num_local_blocks" : "num_global_blocks",
                             "must be at least 1"};
    }
    if (c.num_local_blocks % c.num_global_blocks != 0) {
      return SparsityProblem{"num_local_blocks",
                             "(" + std::to_string(c.num_local_blocks) +
                                 ") must be divisible by num_global_blocks (" +
                                 std::to_string(c.num_global_blocks) + ")"};
    }
    if (c.num_different_global_patterns > 1 && !c.different_layout_per_head) {
      return SparsityProblem{"num_different_global_patterns",
                             "is " + std::to_string(c.num_different_global_patterns) +
                                 "; more than one layout needs different_layout_per_head true"};
    }
    const int64_t most = c.num_local_blocks / c.num_global_blocks;
    if (c.num_different_global_patterns < 1 || c.num_different_global_patterns > most) {
      return SparsityProblem{"num_different_global_patterns",
                             "is " + std::to_string(c.num_different_global_patterns) +
                                 "; expected 1 to num_local_blocks / num_global_blocks = " +
                                 std::to_string(most)};
    }
  }
  if (m == "variable") {
    if (c.local_window_blocks.empty()) {
      return SparsityProblem{"local_window_blocks", "is empty; expected at least one window"};
    }
    for (int64_t w : c.local_window_blocks) {
      if (w < 1) {
        return SparsityProblem{"local_window_blocks",
                               "contains " + std::to_string(w) + "; windows have at least 1 block"};
      }
    }
  }
  if (m == "bigbird" && c.num_global_blocks < 1) {
    return SparsityProblem{"num_global_blocks", "must be at least 1"};
  }
  if ((m == "bigbird" || m == "bslongformer" || m == "local") && c.num_sliding_window_blocks < 1) {
    return SparsityProblem{"num_sliding_window_blocks", "must be at least 1"};
  }
  if (m == "variable" || m == "bslongformer") return check_global_ends(c);
  return std::nullopt;
}

std::optional<SparseAttentionConfig> read_sparse_attention_config(const json& ds_config,
                                                                  const std::string& source) {
  using config_detail::ConfigReader;
  using config_detail::Strictness;
  if (!ds_config.is_object()) {
    throw ConfigError(source + ": expected a JSON object (a DeepSpeed config)");
  }
  std::vector<std::string> warnings;
  ConfigReader top(&ds_config, "", source, Strictness::kWarnUnknown, &warnings);
  top.mark_all_known();
  return config_detail::read_sparse_attention(top);
}

std::optional<SparseAttentionConfig> read_sparse_attention_config(const std::string& config) {
  const config_detail::LoadedConfig loaded = config_detail::load_config_text(config);
  return read_sparse_attention_config(loaded.doc, loaded.source);
}

std::optional<SparseAttentionConfig> sparse_attention_config(const DeepSpeedConfig& config) {
  return read_sparse_attention_config(config.raw.is_object() ? config.raw : json::object(),
                                      config.source);
}

}  // namespace deepspeed::sparse_attention

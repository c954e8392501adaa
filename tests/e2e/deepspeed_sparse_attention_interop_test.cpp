// sparse_attention against Python DeepSpeed 0.15.4 (.venv-deepspeed), through
// tests/e2e/deepspeed_sparse_attention_interop.py: for every mode, with and without random
// blocks (both of CPython's sampling paths), per-head layouts, short last windows, global block
// ranges and unidirectional attention, DeepSpeed's config reader gives the values ours gives,
// and its SparsityConfig classes, after random.seed(seed), the layout ours makes from seed.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <string>

#include "deepspeed/sparse_attention.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::sparse_attention {
namespace {

json cases() {
  return json::parse(R"([
    {"heads": 4, "seq_len": 512, "seed": 0, "section": {}},
    {"heads": 4, "seq_len": 336, "seed": 0, "section": {"mode": "fixed", "block": 16,
      "attention": "unidirectional", "num_local_blocks": 4, "num_global_blocks": 2,
      "different_layout_per_head": true, "num_different_global_patterns": 2}},
    {"heads": 2, "seq_len": 80, "seed": 0, "section": {"mode": "fixed", "block": 8,
      "num_local_blocks": 3, "horizontal_global_attention": true}},
    {"heads": 2, "seq_len": 512, "seed": 1, "section": {"mode": "variable"}},
    {"heads": 3, "seq_len": 384, "seed": 11, "section": {"mode": "variable",
      "num_random_blocks": 3, "local_window_blocks": [2, 3, 1], "global_block_indices": [1, 7],
      "global_block_end_indices": [3, 9], "attention": "unidirectional",
      "different_layout_per_head": true}},
    {"heads": 2, "seq_len": 192, "seed": 4, "section": {"mode": "variable",
      "num_random_blocks": 2, "global_block_indices": [0, 5],
      "horizontal_global_attention": true}},
    {"heads": 2, "seq_len": 512, "seed": 5, "section": {"mode": "bigbird",
      "num_random_blocks": 2, "num_sliding_window_blocks": 3, "num_global_blocks": 2,
      "different_layout_per_head": true}},
    {"heads": 2, "seq_len": 1024, "seed": 6, "section": {"mode": "bigbird", "block": 32,
      "num_random_blocks": 9}},
    {"heads": 1, "seq_len": 256, "seed": 8, "section": {"mode": "bigbird",
      "num_random_blocks": 1}, "class_extra": {"attention": "unidirectional"}},
    {"heads": 2, "seq_len": 256, "seed": 0, "section": {"mode": "bslongformer",
      "num_sliding_window_blocks": 5, "global_block_indices": [0, 10],
      "global_block_end_indices": [2, 12]}},
    {"heads": 1, "seq_len": 256, "seed": 0, "section": {"mode": "bslongformer",
      "global_block_indices": [3, 40]}, "class_extra": {"attention": "unidirectional"}},
    {"heads": 2, "seq_len": 256, "seed": 0, "section": {"mode": "dense", "block": 32}},
    {"heads": 2, "seq_len": 256, "seed": 0, "local": true, "section": {"block": 16,
      "num_sliding_window_blocks": 5, "attention": "unidirectional"}},
    {"heads": 1, "seq_len": 128, "seed": 0, "local": true, "section": {"block": 16,
      "num_sliding_window_blocks": 4, "attention": "bidirectional"}}
  ])");
}

// Ours for a case: the section through our reader (with the keys DeepSpeed's reader drops
// merged in: ours honours them), or for "local" the struct set directly.
SparseAttentionConfig our_config(const json& c) {
  if (c.value("local", false)) {
    SparseAttentionConfig out;
    out.mode = "local";
    out.block = c["section"]["block"];
    out.num_sliding_window_blocks = c["section"]["num_sliding_window_blocks"];
    out.attention = c["section"]["attention"];
    return out;
  }
  json section = c["section"];
  if (c.contains("class_extra")) section.update(c["class_extra"]);
  return *read_sparse_attention_config(json{{"sparse_attention", section}}, "case");
}

// DeepSpeed's reader's dict against our struct, key by key.
void expect_same_reading(const json& theirs, const SparseAttentionConfig& ours, size_t i) {
  for (const auto& [key, value] : theirs.items()) {
    const std::string where = "case " + std::to_string(i) + ": " + key;
    if (key == "mode")
      EXPECT_EQ(value.get<std::string>(), ours.mode) << where;
    else if (key == "block")
      EXPECT_EQ(value.get<int64_t>(), ours.block) << where;
    else if (key == "different_layout_per_head")
      EXPECT_EQ(value.get<bool>(), ours.different_layout_per_head) << where;
    else if (key == "num_local_blocks")
      EXPECT_EQ(value.get<int64_t>(), ours.num_local_blocks) << where;
    else if (key == "num_global_blocks")
      EXPECT_EQ(value.get<int64_t>(), ours.num_global_blocks) << where;
    else if (key == "attention")
      EXPECT_EQ(value.get<std::string>(), ours.attention) << where;
    else if (key == "horizontal_global_attention")
      EXPECT_EQ(value.get<bool>(), ours.horizontal_global_attention) << where;
    else if (key == "num_different_global_patterns")
      EXPECT_EQ(value.get<int64_t>(), ours.num_different_global_patterns) << where;
    else if (key == "num_random_blocks")
      EXPECT_EQ(value.get<int64_t>(), ours.num_random_blocks) << where;
    else if (key == "local_window_blocks")
      EXPECT_EQ(value.get<std::vector<int64_t>>(), ours.local_window_blocks) << where;
    else if (key == "global_block_indices")
      EXPECT_EQ(value.get<std::vector<int64_t>>(), ours.global_block_indices) << where;
    else if (key == "global_block_end_indices")
      EXPECT_EQ(value.is_null() ? std::nullopt : std::optional(value.get<std::vector<int64_t>>()),
                ours.global_block_end_indices)
          << where;
    else if (key == "num_sliding_window_blocks")
      EXPECT_EQ(value.get<int64_t>(), ours.num_sliding_window_blocks) << where;
    else
      ADD_FAILURE() << where << " is a key DeepSpeed reads that this test does not know";
  }
}

TEST(DeepSpeedSparseAttentionInterop, ReaderAndLayoutsEqualDeepSpeeds) {
  testing::TempDir dir("ds_sparse_attention_interop");
  const json all = cases();
  std::ofstream(dir.file("cases.json")) << all.dump();
  const auto run = testing::run_command(std::string("OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu ") +
                                        DS_DEEPSPEED_PYTHON + " " + DS_INTEROP_SCRIPT + " " +
                                        dir.file("cases.json") + " " + dir.file("out.json"));
  ASSERT_EQ(run.exit_code, 0) << run.out << run.err;
  std::ifstream in(dir.file("out.json"));
  const json theirs = json::parse(in);
  ASSERT_EQ(theirs.size(), all.size());
  int64_t random_blocks_seen = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const json& c = all[i];
    const SparseAttentionConfig config = our_config(c);
    if (!theirs[i]["read"].is_null()) expect_same_reading(theirs[i]["read"], config, i);
    const at::Tensor ours = SparsityConfig(c["heads"], config, c["seed"]).make_layout(c["seq_len"]);
    const auto& rows = theirs[i]["layout"];
    std::vector<int64_t> flat;
    for (const auto& head : rows) {
      for (const auto& row : head) {
        for (const auto& v : row) flat.push_back(v.get<int64_t>());
      }
    }
    const at::Tensor expected = torch::tensor(flat, at::kLong).view(ours.sizes());
    EXPECT_TRUE(torch::equal(ours, expected))
        << "case " << i << " (" << c["section"].dump() << "): ours\n"
        << ours << "\nDeepSpeed's\n"
        << expected;
    random_blocks_seen += config.num_random_blocks;
  }
  EXPECT_GT(random_blocks_seen, 10);  // the random draws were exercised
}

}  // namespace
}  // namespace deepspeed::sparse_attention

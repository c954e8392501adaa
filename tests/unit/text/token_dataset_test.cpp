// Token cache (build, reuse, invalidation, concurrent builders), train/val split, windows, and
// DistributedBatchSampler's data-parallel semantics.
#include "token_dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <thread>

#include "text_test_util.h"

namespace deepspeed::examples {
namespace {

using testing::slurp;
using testing::TempDir;
using testing::test_data_path;
using testing::write_bytes;

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = BpeTokenizer::from_default_files();
  return tok;
}

TEST(TokenDataset, TokenizeCorpusEqualsEncode) {
  const std::string text = slurp(test_data_path("austen_slice.txt"));
  const auto tokens = tokenize_corpus(gpt2(), text);
  const auto ids = gpt2().encode(text);
  ASSERT_EQ(tokens.size(), ids.size());
  EXPECT_TRUE(std::equal(tokens.begin(), tokens.end(), ids.begin()));
}

TEST(TokenCache, BuildsThenReusesThenRebuildsWhenSourceChanges) {
  TempDir dir;
  const std::string text_path = dir.file("austen.txt");
  const std::string text = slurp(test_data_path("austen_slice.txt"));
  write_bytes(text_path, text);

  bool rebuilt = false;
  const auto first = load_or_build_token_cache(gpt2(), text_path, &rebuilt);
  EXPECT_TRUE(rebuilt);
  EXPECT_EQ(first, tokenize_corpus(gpt2(), text));

  // Layout: 96-byte header, then little-endian uint16 ids.
  const std::string cache = slurp(token_cache_path(text_path));
  ASSERT_EQ(cache.size(), 96 + 2 * first.size());
  EXPECT_EQ(cache.substr(0, 8), "DSTOKU16");
  EXPECT_EQ(static_cast<uint8_t>(cache[96]) | (static_cast<uint8_t>(cache[97]) << 8), first[0]);

  EXPECT_EQ(load_or_build_token_cache(gpt2(), text_path, &rebuilt), first);
  EXPECT_FALSE(rebuilt);

  // Same size, different bytes: only the hash can tell.
  std::string changed = text;
  changed[0] = 'e';
  write_bytes(text_path, changed);
  const auto third = load_or_build_token_cache(gpt2(), text_path, &rebuilt);
  EXPECT_TRUE(rebuilt);
  EXPECT_EQ(third, tokenize_corpus(gpt2(), changed));
}

TEST(TokenCache, TruncatedOrForeignCacheIsRebuilt) {
  TempDir dir;
  const std::string text_path = dir.file("t.txt");
  write_bytes(text_path, "It is a truth universally acknowledged.");
  const auto tokens = load_or_build_token_cache(gpt2(), text_path);
  const std::string cache = slurp(token_cache_path(text_path));
  bool rebuilt = false;
  write_bytes(token_cache_path(text_path), cache.substr(0, cache.size() - 1));
  EXPECT_EQ(load_or_build_token_cache(gpt2(), text_path, &rebuilt), tokens);
  EXPECT_TRUE(rebuilt);
  write_bytes(token_cache_path(text_path), "garbage");
  EXPECT_EQ(load_or_build_token_cache(gpt2(), text_path, &rebuilt), tokens);
  EXPECT_TRUE(rebuilt);
}

TEST(TokenCache, ConcurrentBuildersLeaveOneValidCacheAndNoTempFiles) {
  TempDir dir;
  const std::string text_path = dir.file("austen.txt");
  write_bytes(text_path, slurp(test_data_path("austen_slice.txt")));
  std::vector<std::vector<uint16_t>> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) {
    threads.emplace_back(
        [&] { r = load_or_build_token_cache(BpeTokenizer::from_default_files(), text_path); });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, results[0]);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    ++files;
    EXPECT_EQ(entry.path().string().find(".tmp."), std::string::npos) << entry.path();
  }
  EXPECT_EQ(files, 2);
  bool rebuilt = true;
  EXPECT_EQ(load_or_build_token_cache(gpt2(), text_path, &rebuilt), results[0]);
  EXPECT_FALSE(rebuilt);
}

TEST(TokenCache, MissingSourceIsNamed) {
  EXPECT_THROW_WITH(load_or_build_token_cache(gpt2(), "/nonexistent/austen.txt"),
                    "/nonexistent/austen.txt");
}

// The whole corpus, when scripts/fetch_corpus.sh has put it in data/: token count and speed.
TEST(TokenCache, FullAustenCorpusHas993332Tokens) {
  const std::string path = std::string(DS_SOURCE_DIR) + "/data/austen.txt";
  if (!std::filesystem::exists(path))
    GTEST_SKIP() << "no " << path << " (run scripts/fetch_corpus.sh)";
  const std::string text = slurp(path);
  const BpeTokenizer tok = BpeTokenizer::from_default_files();
  const auto start = std::chrono::steady_clock::now();
  const auto tokens = tokenize_corpus(tok, text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "tokenized " << text.size() << " bytes into " << tokens.size() << " tokens in "
            << seconds << " s\n";
  EXPECT_EQ(tokens.size(), 993332u);
  EXPECT_LT(seconds, 5.0);
}

TEST(TokenSplit, LastFractionIsValidation) {
  std::vector<uint16_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(i);
  const TokenSplit split = split_train_val(tokens, 0.05);
  ASSERT_EQ(split.train.size(), 950u);
  ASSERT_EQ(split.val.size(), 50u);
  EXPECT_EQ(split.train.back(), 949);
  EXPECT_EQ(split.val.front(), 950);
  EXPECT_EQ(split_train_val(tokens, 0.0).val.size(), 0u);
  EXPECT_THROW_WITH(split_train_val(tokens, 1.0), "val_fraction");
  EXPECT_THROW_WITH(split_train_val(tokens, -0.1), "val_fraction");
}

TEST(Windows, CountAndGather) {
  EXPECT_EQ(num_windows(0, 4), 0);
  EXPECT_EQ(num_windows(4, 4), 0);  // the last target needs one more token
  EXPECT_EQ(num_windows(5, 4), 1);
  EXPECT_EQ(num_windows(13, 4), 3);
  std::vector<uint16_t> tokens(13);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>(100 + i);
  std::vector<int64_t> inputs(8), targets(8);
  gather_windows(tokens, {2, 0}, 4, inputs.data(), targets.data());
  EXPECT_EQ(inputs, (std::vector<int64_t>{108, 109, 110, 111, 100, 101, 102, 103}));
  EXPECT_EQ(targets, (std::vector<int64_t>{109, 110, 111, 112, 101, 102, 103, 104}));
  EXPECT_THROW_WITH(gather_windows(tokens, {3}, 4, inputs.data(), targets.data()), "window 3");
}

TEST(DistributedBatchSampler, PermutationIsPinned) {
  // Values from a Python transcription of the algorithm documented in token_dataset.h.
  EXPECT_EQ(DistributedBatchSampler::epoch_permutation(10, 1234, 0),
            (std::vector<int64_t>{4, 6, 5, 2, 7, 0, 1, 8, 9, 3}));
  EXPECT_EQ(DistributedBatchSampler::epoch_permutation(10, 1234, 1),
            (std::vector<int64_t>{4, 5, 6, 9, 2, 0, 7, 8, 1, 3}));
  EXPECT_EQ(DistributedBatchSampler::epoch_permutation(10, 0, 0),
            (std::vector<int64_t>{8, 7, 6, 5, 3, 9, 2, 4, 1, 0}));
  auto p = DistributedBatchSampler::epoch_permutation(4097, 7, 3);
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < 4097; ++i) ASSERT_EQ(p[i], i);
}

// 2 ranks x micro_batch b see, in every micro-step, exactly what 1 rank x micro_batch 2b sees:
// rank r's row j is row j*2 + r of the single rank's micro-batch (DistributedSampler order).
TEST(DistributedBatchSampler, RanksTogetherEqualOneRankWithWorldTimesMicroBatch) {
  for (int64_t world : {2, 3}) {
    const int64_t windows = 1001, mb = 4, gas = 2;
    DistributedBatchSampler single(windows, mb * world, gas, 1, 0, 42);
    std::vector<DistributedBatchSampler> ranks;
    for (int64_t r = 0; r < world; ++r) ranks.emplace_back(windows, mb, gas, world, r, 42);
    ASSERT_EQ(single.batches_per_epoch(), ranks[0].batches_per_epoch());
    // Two and a half epochs, so the epoch boundary is crossed on all samplers alike.
    const int64_t steps = single.micro_batches_per_epoch() * 5 / 2;
    for (int64_t step = 0; step < steps; ++step) {
      const auto all = single.next_micro_batch();
      ASSERT_EQ(all.size(), static_cast<size_t>(mb * world));
      for (int64_t r = 0; r < world; ++r) {
        const auto mine = ranks[r].next_micro_batch();
        ASSERT_EQ(ranks[r].epoch(), single.epoch());
        for (int64_t j = 0; j < mb; ++j) {
          ASSERT_EQ(mine[j], all[j * world + r]) << "world " << world << " step " << step;
        }
      }
    }
  }
}

TEST(DistributedBatchSampler, EpochCoversDisjointWindowsWithEqualCountsPerRank) {
  const int64_t windows = 1000, mb = 3, gas = 2, world = 4;  // 1000 % 24 != 0: tail dropped
  std::set<int64_t> seen;
  for (int64_t r = 0; r < world; ++r) {
    DistributedBatchSampler s(windows, mb, gas, world, r, 9);
    EXPECT_EQ(s.batches_per_epoch(), 1000 / 24);
    for (int64_t k = 0; k < s.micro_batches_per_epoch(); ++k) {
      for (int64_t w : s.next_micro_batch()) {
        EXPECT_TRUE(w >= 0 && w < windows);
        EXPECT_TRUE(seen.insert(w).second) << "window " << w << " served twice";
      }
    }
    EXPECT_EQ(s.epoch(), 0);
    s.next_micro_batch();
    EXPECT_EQ(s.epoch(), 1);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(1000 / 24 * 24));
}

TEST(DistributedBatchSampler, DeterministicAndSeedDependent) {
  DistributedBatchSampler a(500, 2, 1, 2, 1, 5), b(500, 2, 1, 2, 1, 5), c(500, 2, 1, 2, 1, 6);
  bool differs = false;
  for (int i = 0; i < 300; ++i) {
    const auto x = a.next_micro_batch();
    EXPECT_EQ(x, b.next_micro_batch());
    differs |= x != c.next_micro_batch();
  }
  EXPECT_TRUE(differs);
  EXPECT_NE(DistributedBatchSampler::epoch_permutation(500, 5, 0),
            DistributedBatchSampler::epoch_permutation(500, 5, 1));
}

TEST(DistributedBatchSampler, SetPositionResumesTheSameStream) {
  DistributedBatchSampler a(300, 2, 2, 2, 0, 11);
  std::vector<std::vector<int64_t>> stream;
  for (int i = 0; i < 200; ++i) stream.push_back(a.next_micro_batch());
  DistributedBatchSampler b(300, 2, 2, 2, 0, 11);
  const int64_t per_epoch = b.micro_batches_per_epoch();  // 75 / 8 * 2 = 74
  b.set_position(130 / per_epoch, 130 % per_epoch);
  for (int i = 130; i < 200; ++i) EXPECT_EQ(b.next_micro_batch(), stream[i]) << i;
  EXPECT_THROW_WITH(b.set_position(0, per_epoch + 1), "set_position");
}

TEST(DistributedBatchSampler, RejectsBadArguments) {
  EXPECT_THROW_WITH(DistributedBatchSampler(10, 4, 2, 2, 0, 1),
                    "10 windows cannot fill one global batch of 16");
  EXPECT_THROW_WITH(DistributedBatchSampler(100, 4, 1, 2, 2, 1), "rank 2 outside [0, 2)");
  EXPECT_THROW_WITH(DistributedBatchSampler(100, 0, 1, 1, 0, 1), "must be positive");
}

}  // namespace
}  // namespace deepspeed::examples

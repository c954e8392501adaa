// BpeTokenizer against GPT-2's ids: hand-checked cases, the golden file written by
// make_bpe_golden.py (two independent Python oracles), the Austen fixture, round trips, errors.
#include "bpe_tokenizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "sha256.h"
#include "text_test_util.h"

namespace deepspeed::examples {
namespace {

using testing::slurp;
using testing::test_data_path;
using Ids = std::vector<int32_t>;

const BpeTokenizer& gpt2() {
  static const BpeTokenizer tok = BpeTokenizer::from_default_files();
  return tok;
}

TEST(BpeTokenizer, HelloWorldIsGpt2Ids) {
  EXPECT_EQ(gpt2().encode("Hello world"), (Ids{15496, 995}));
}

TEST(BpeTokenizer, VocabularyShape) {
  EXPECT_EQ(gpt2().vocab_size(), 50257u);
  EXPECT_EQ(gpt2().eot_token(), 50256);
  EXPECT_EQ(gpt2().decode({50256}), "<|endoftext|>");
  // Special tokens are not parsed from text: it encodes as ordinary characters.
  EXPECT_NE(gpt2().encode("<|endoftext|>"), (Ids{50256}));
}

// Ids below are GPT-2's (checked with tiktoken; also in the golden file).
TEST(BpeTokenizer, ContractionsAreCaseSensitive) {
  EXPECT_EQ(gpt2().encode("I'm"), (Ids{40, 1101}));
  EXPECT_EQ(gpt2().encode("don't"), (Ids{9099, 470}));
  EXPECT_EQ(gpt2().encode("I'M"), (Ids{40, 6, 44}));
  EXPECT_EQ(gpt2().encode("Mr. Woodhouse's"), (Ids{5246, 13, 5326, 4803, 338}));
}

TEST(BpeTokenizer, NumbersAndPunctuationRuns) {
  EXPECT_EQ(gpt2().encode("1234"), (Ids{1065, 2682}));
  EXPECT_EQ(gpt2().encode("3.14159"), (Ids{18, 13, 1415, 19707}));
  EXPECT_EQ(gpt2().encode("Hello, world!!! ...?"), (Ids{15496, 11, 995, 10185, 2644, 30}));
  EXPECT_EQ(gpt2().encode("--a something--"), (Ids{438, 64, 1223, 438}));
}

TEST(BpeTokenizer, WhitespaceRuns) {
  EXPECT_EQ(gpt2().encode("a  b"), (Ids{64, 220, 275}));
  EXPECT_EQ(gpt2().encode("trailing   "), (Ids{9535, 4386, 220, 220, 220}));
  EXPECT_EQ(gpt2().encode("\n\n"), (Ids{628}));
  EXPECT_EQ(gpt2().encode("a\n\nb"), (Ids{64, 198, 198, 65}));
  EXPECT_EQ(gpt2().encode(""), Ids{});
}

TEST(BpeTokenizer, NonAscii) {
  EXPECT_EQ(gpt2().encode("café"), (Ids{66, 1878, 2634}));
  EXPECT_EQ(gpt2().encode("£5 and €10"), (Ids{14988, 20, 290, 10432, 940}));
  EXPECT_EQ(gpt2().encode("\xC2\xA0nbsp"), (Ids{1849, 77, 24145}));  // U+00A0 is \s
}

TEST(BpeTokenizer, MatchesGoldenFile) {
  const auto golden = nlohmann::json::parse(slurp(test_data_path("gpt2_bpe_golden.json")));
  ASSERT_GT(golden["cases"].size(), 300u);
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const Ids ids = gpt2().encode(text);
    EXPECT_EQ(ids, c["ids"].get<Ids>()) << "text: " << nlohmann::json(text).dump();
    EXPECT_EQ(gpt2().decode(ids), text);
  }
}

TEST(BpeTokenizer, AustenFixtureMatchesGoldenAndRoundTrips) {
  const auto golden = nlohmann::json::parse(slurp(test_data_path("gpt2_bpe_golden.json")));
  const std::string text = slurp(test_data_path("austen_slice.txt"));
  ASSERT_EQ(sha256_hex(text), golden["fixture"]["sha256"].get<std::string>())
      << "austen_slice.txt changed; rerun tests/unit/text/make_bpe_golden.py";
  const Ids ids = gpt2().encode(text);
  EXPECT_EQ(ids, golden["fixture"]["ids"].get<Ids>());
  EXPECT_EQ(gpt2().decode(ids), text);
  // Paragraph by paragraph too: the word cache must not make results depend on history.
  const BpeTokenizer fresh = BpeTokenizer::from_default_files();
  const std::string para = text.substr(0, text.find("\n\n", 500));
  EXPECT_EQ(fresh.encode(para), gpt2().encode(para));
}

TEST(BpeTokenizer, RoundTripsArbitraryBytes) {
  std::mt19937 rng(7);  // only the bytes' variety matters here, not their exact values
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng() % 64, '\0');
    for (char& c : s) c = static_cast<char>(rng() & 0xFF);
    EXPECT_EQ(gpt2().decode(gpt2().encode(s)), s) << "trial " << trial;
  }
}

TEST(BpeTokenizer, LongWordsStayFast) {
  // GPT-2's reference BPE is quadratic per word; a 300 kB "word" must still take well under 1 s.
  const std::string text = std::string(200000, 'a') + std::string(100000, '-');
  const auto start = std::chrono::steady_clock::now();
  const Ids ids = BpeTokenizer::from_default_files().encode(text);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(gpt2().decode(ids), text);
  EXPECT_LT(seconds, 2.0);
}

TEST(BpeTokenizer, ConcurrentEncodesAgree) {
  const std::string text = slurp(test_data_path("austen_slice.txt"));
  const BpeTokenizer tok = BpeTokenizer::from_default_files();
  const Ids expected = gpt2().encode(text);
  std::vector<Ids> results(4);
  std::vector<std::thread> threads;
  for (auto& r : results) threads.emplace_back([&] { r = tok.encode(text); });
  for (auto& t : threads) t.join();
  for (const auto& r : results) EXPECT_EQ(r, expected);
}

TEST(BpeTokenizer, DecodeRejectsUnknownId) {
  EXPECT_THROW_WITH(gpt2().decode({15496, 50257}), "token id 50257");
  EXPECT_THROW_WITH(gpt2().decode({-1}), "token id -1");
}

TEST(BpeTokenizer, MissingFileIsNamed) {
  EXPECT_THROW_WITH(BpeTokenizer::from_files("/nonexistent/encoder.json",
                                             std::string(DS_GPT2_BPE_DIR) + "/vocab.bpe"),
                    "/nonexistent/encoder.json");
}

TEST(BpeTokenizer, MalformedMergeNamesFileAndLine) {
  testing::TempDir dir;
  testing::write_bytes(dir.file("vocab.bpe"), "#version: 0.2\nĠ t\nh e x\n");
  EXPECT_THROW_WITH(BpeTokenizer::from_files(std::string(DS_GPT2_BPE_DIR) + "/encoder.json",
                                             dir.file("vocab.bpe")),
                    dir.file("vocab.bpe") + ":3: expected two tokens");
  testing::write_bytes(dir.file("vocab2.bpe"), "#version: 0.2\nzzzzzz qqqqqq\n");
  EXPECT_THROW_WITH(BpeTokenizer::from_files(std::string(DS_GPT2_BPE_DIR) + "/encoder.json",
                                             dir.file("vocab2.bpe")),
                    "vocab2.bpe:2: merge \"zzzzzz qqqqqq\" uses or makes a token missing");
}

TEST(BpeTokenizer, MalformedEncoderJsonIsNamed) {
  testing::TempDir dir;
  testing::write_bytes(dir.file("encoder.json"), "{\"a\": 0,");
  EXPECT_THROW_WITH(BpeTokenizer::from_files(dir.file("encoder.json"),
                                             std::string(DS_GPT2_BPE_DIR) + "/vocab.bpe"),
                    dir.file("encoder.json") + ": not valid JSON");
}

}  // namespace
}  // namespace deepspeed::examples

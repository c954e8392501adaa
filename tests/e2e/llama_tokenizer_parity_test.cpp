// LlamaTokenizer against Hugging Face tokenizers on the pre-tokenizers of real models (SmolLM's
// individual digits, Llama 3's split pattern with ignore_merges and a Sequence post-processor,
// Qwen2's NFC normalizer and pattern, GPT-4o's (Phi-4-mini's) and Mistral NeMo's letter-case
// patterns, DeepSeek-V3's three Splits; SentencePiece-style ones further down):
// tokenizer_pretokenizers_reference.py trains a small BPE with each, saves its tokenizer.json,
// pre-tokenizes and encodes the texts; we load the same file and must split every text into the
// same words (BPE alone would hide most splitting errors) and give the same ids. The texts
// are a few by hand and 400 random strings over letters, digits of several scripts, every kind of
// whitespace and line break, contractions in both cases and symbols, then 200 more that add kana,
// punctuation and symbols beyond ASCII, marks, and control and format characters. The Python environment comes
// from the CTest fixture llama_python_refs.
#include <filesystem>
#include <fstream>
#include <random>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "gguf_file.h"
#include "llama_tokenizer.h"
#include "word_split.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::run_command;
using testing::TempDir;

const std::string kPython = std::string(DS_SOURCE_DIR) + "/.venv/bin/python";
const std::string kCorpus = std::string(DS_SOURCE_DIR) + "/tests/data/austen_slice.txt";

std::vector<std::string> texts() {
  std::vector<std::string> t = {
      "It is a truth universally acknowledged, that a single man in possession of a good fortune",
      "I'M here, it's 12345 ok; WE'RE done. They'LL see 3.14159 and 1,000,000!",
      "  x\n\n  y \r\n\tz   \n", "(hello) [world] {Elizabeth}", "<|begin_of_text|>hi<|end_of_text|>",
      "trailing spaces   ", "\n\n\n", "caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82",
      // Not NFC: e + combining acute, the Angstrom sign, Hangul jamo, a stacked pair of marks in
      // the wrong canonical order; NFC composes or reorders each.
      "Cafe\xCC\x81 \xE2\x84\xAB \xE1\x84\x80\xE1\x85\xA1 a\xCC\x81\xCC\xA3 <|im_start|>e\xCC\x81",
  };
  const std::vector<std::string> pieces = {
      "a", "b", "Q", "\xC3\xA9", "\xC3\x9F", "\xC5\xBF", "\xD0\x96", "\xE4\xB8\xAD", "\xD8\xB9",
      "0", "7", "\xD9\xA3", "\xE2\x85\xAB", "\xC2\xBD", " ", "  ", "\t", "\n", "\r", "\r\n",
      "\xC2\xA0", "\xE3\x80\x80", "\xC2\x85", "\x1C", "\xE2\x80\xA8", "'", "'s", "'S", "'Re",
      "'LL", "'ve", "'D", "'t", ".", ",", "!", "(", "-", "\xF0\x9F\x98\x80", "\xCC\x81", "$",
      "_", "12345", "hello", "World", " possession", "\x0B",
      // Letter cases for GPT-4o's pattern: a title-case letter (Lt), a modifier letter (Lm), a
      // capital with an accent, capitals before small letters, a consonant and its virama (Lo
      // then Mn); and the slash its symbol runs end with.
      "\xC7\x85", "\xCA\xB0", "\xC3\x89", "HTTP", "Server", "\xE0\xA4\x95\xE0\xA5\x8D", "/"};
  std::mt19937 rng(20261206);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) s += pieces[rng() % pieces.size()];
    t.push_back(s);
  }
  // DeepSeek-V3's classes: hiragana and katakana with their voicing mark (a symbol), middle dot
  // (punctuation) and length mark (a letter), an ideograph beyond its range (U+9FA6), a euro
  // sign, a copyright sign, guillemets, an em dash, a control character, a zero-width joiner,
  // marks alone and after a space, ASCII symbols before letters, long numbers.
  std::vector<std::string> more = pieces;
  for (const char* p : {"\xE3\x81\x82", "\xE3\x82\x9B", "\xE3\x83\xBB", "\xE3\x83\xBC",
                        "\xE3\x82\xA0", "\xE9\xBE\xA6", "\xE2\x82\xAC", "\xC2\xA9",
                        "\xC2\xAB", "\xE2\x80\x94", "\x01", "\xE2\x80\x8D", " \xCC\x81",
                        ".com", "__init", "#x", "1234567", "\xE3\x82\xAB\xE3\x82\xBF"}) {
    more.push_back(p);
  }
  for (int i = 0; i < 200; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 20);
    for (int k = 0; k < n; ++k) s += more[rng() % more.size()];
    t.push_back(s);
  }
  return t;
}

// Where each word of `text` ends, counted in code points as tokenizers' offsets are.
std::vector<int64_t> word_ends_in_code_points(WordSplit split, const std::string& text) {
  std::vector<int64_t> ends;
  int64_t code_points = 0;
  for_each_word(split, text, [&](std::string_view word) {
    for (unsigned char c : word) code_points += (c & 0xC0) != 0x80;
    ends.push_back(code_points);
  });
  return ends;
}

TEST(LlamaTokenizerParity, PreTokenizersOfRealModelsEncodeAsHuggingFaceTokenizers) {
  ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " (run scripts/setup_python_refs.sh)";
  TempDir dir("llama_tokenizer_parity");
  const auto all = texts();
  std::ofstream(dir.file("texts.json")) << nlohmann::json(all).dump();
  const auto r = run_command(kPython + " " + DS_TOKENIZER_REFERENCE_PY + " " + kCorpus + " '" +
                             dir.file("texts.json") + "' '" + dir.path() + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const std::string name :
       {"llama3", "smollm", "qwen2", "o200k", "tekken", "deepseek_v3"}) {
    SCOPED_TRACE(name);
    const std::string json_path = dir.file(name + "/tokenizer.json");
    const auto tok = LlamaTokenizer::from_hf_json(json_path);
    std::ifstream in(dir.file(name + "/ids.json"));
    const auto want = nlohmann::json::parse(in);
    ASSERT_EQ(want.size(), all.size());
    const WordSplit split = word_split_from_hf_json(
        nlohmann::json::parse(std::ifstream(json_path))["pre_tokenizer"], json_path);
    std::ifstream words_in(dir.file(name + "/words.json"));
    const auto want_words = nlohmann::json::parse(words_in);
    int split_mismatches = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const auto expected = want_words[i].get<std::vector<int64_t>>();
      if (word_ends_in_code_points(split, all[i]) != expected && ++split_mismatches <= 5) {
        ADD_FAILURE() << "text " << i << " " << nlohmann::json(all[i]).dump() << ": word ends "
                      << nlohmann::json(word_ends_in_code_points(split, all[i])).dump()
                      << ", tokenizers " << nlohmann::json(expected).dump();
      }
    }
    EXPECT_EQ(split_mismatches, 0);
    int mismatches = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const auto expected = want[i].get<std::vector<int64_t>>();
      if (tok.encode(all[i]) != expected && ++mismatches <= 5) {
        ADD_FAILURE() << "text " << i << " " << nlohmann::json(all[i]).dump() << ": got "
                      << nlohmann::json(tok.encode(all[i])).dump() << ", tokenizers "
                      << nlohmann::json(expected).dump();
      }
    }
    EXPECT_EQ(mismatches, 0);
    if (name == "deepseek_v3") {
      // The same vocabulary as llama.cpp's converter writes a DeepSeek-V3 GGUF encodes alike.
      const auto from_gguf =
          LlamaTokenizer::from_gguf(GgufFile::open(dir.file(name + "/tokenizer.gguf")));
      int gguf_mismatches = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        const auto expected = want[i].get<std::vector<int64_t>>();
        if (from_gguf.encode(all[i]) != expected && ++gguf_mismatches <= 5) {
          ADD_FAILURE() << "GGUF, text " << i << " " << nlohmann::json(all[i]).dump() << ": got "
                        << nlohmann::json(from_gguf.encode(all[i])).dump();
        }
      }
      EXPECT_EQ(gguf_mismatches, 0);
    }

    // What --save_hf writes reads back to a tokenizer that encodes the same.
    std::ifstream original_in(json_path);
    const auto original = nlohmann::json::parse(original_in);
    const auto exported = tok.to_hf_json();
    EXPECT_EQ(exported["pre_tokenizer"], original["pre_tokenizer"]);
    EXPECT_EQ(exported["normalizer"], original["normalizer"]);
    EXPECT_EQ(exported["model"]["ignore_merges"], original["model"].value("ignore_merges", false));
    std::ofstream(dir.file(name + "/exported.json")) << exported.dump();
    const auto again = LlamaTokenizer::from_hf_json(dir.file(name + "/exported.json"));
    for (size_t i = 0; i < 50; ++i) EXPECT_EQ(again.encode(all[i]), tok.encode(all[i])) << i;
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// tokenizer_sentencepiece_reference.py's cases: Llama 2's legacy normalizer, Mistral's Metaspace
// "first", Metaspace "always" with split and without the byte tokens of 3- and 4-byte characters
// (unknown tokens, unfused), and a GGUF "llama" vocabulary with scores only, whose merges
// transformers' GGUF loader makes. Same ids and the same decoded text for every text.
TEST(LlamaTokenizerParity, SentencePieceTokenizersEncodeAsHuggingFace) {
  ASSERT_TRUE(std::filesystem::exists(kPython)) << kPython << " (run scripts/setup_python_refs.sh)";
  TempDir dir("llama_tokenizer_parity_spm");
  auto all = texts();
  for (const char* t : {"<s>hi</s> there", " leading", "two  spaces  ", "<unk> <s>", " ",
                        "\xE2\x96\x81 literal \xE2\x96\x81\xE2\x96\x81", "</s></s>x",
                        "line\nbreak \xF0\x9F\x99\x82\xF0\x9F\x99\x82 caf\xC3\xA9"}) {
    all.push_back(t);
  }
  std::ofstream(dir.file("texts.json")) << nlohmann::json(all).dump();
  const auto r = run_command(kPython + " " + DS_SENTENCEPIECE_REFERENCE_PY + " " + kCorpus + " '" +
                             dir.file("texts.json") + "' '" + dir.path() + "' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const std::string name : {"llama2", "mistral", "split", "gguf"}) {
    SCOPED_TRACE(name);
    const auto tok =
        name == "gguf" ? LlamaTokenizer::from_gguf(GgufFile::open(dir.file("gguf/tokenizer.gguf")))
                       : LlamaTokenizer::from_hf_json(dir.file(name + "/tokenizer.json"));
    ASSERT_TRUE(tok.sentencepiece_style());
    const auto want = read_json(dir.file(name + "/ids.json"));
    const auto want_text = read_json(dir.file(name + "/decoded.json"));
    ASSERT_EQ(want.size(), all.size());
    int mismatches = 0;
    for (size_t i = 0; i < all.size(); ++i) {
      const auto expected = want[i].get<std::vector<int64_t>>();
      const auto got = tok.encode(all[i]);
      if (got != expected && ++mismatches <= 5) {
        ADD_FAILURE() << "text " << i << " " << nlohmann::json(all[i]).dump() << ": got "
                      << nlohmann::json(got).dump() << ", reference "
                      << nlohmann::json(expected).dump();
      }
      const auto text = tok.decode(expected, true);
      if (text != want_text[i].get<std::string>() && ++mismatches <= 5) {
        ADD_FAILURE() << "text " << i << " decodes to " << nlohmann::json(text).dump()
                      << ", reference " << want_text[i].dump();
      }
    }
    EXPECT_EQ(mismatches, 0);
    // What --save_hf writes reads back to a tokenizer that encodes the same.
    std::ofstream(dir.file(name + "/exported.json")) << tok.to_hf_json().dump();
    const auto again = LlamaTokenizer::from_hf_json(dir.file(name + "/exported.json"));
    for (size_t i = 0; i < all.size(); ++i) {
      EXPECT_EQ(again.encode(all[i]), tok.encode(all[i])) << i;
    }
  }
}

}  // namespace
}  // namespace deepspeed::examples

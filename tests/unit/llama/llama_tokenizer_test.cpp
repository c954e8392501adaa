// Byte-level BPE from GGUF metadata on a tiny vocabulary: merges by rank, special tokens matched
// before pre-tokenization, BOS prepended, decode inverting encode, and the tokenizer.json export
// read back to the same encoder. (Parity with transformers on the real vocabulary is in
// tests/e2e/llama_parity_test.cpp.)
#include "llama_tokenizer.h"

#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "gguf_file.h"
#include "gguf_test_writer.h"
#include "support/expect_throw.h"
#include "support/temp_dir.h"

namespace deepspeed::examples {
namespace {

using testing::GgufTestWriter;
using testing::TempDir;

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  s += static_cast<char>(0xC0 | (cp >> 6));
  s += static_cast<char>(0x80 | (cp & 0x3F));
  return s;
}

// GPT-2's byte alphabet: printable Latin-1 bytes stand for themselves, the rest from U+0100 on.
std::vector<std::string> byte_tokens() {
  std::vector<std::string> t;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    t.push_back(utf8(printable ? static_cast<uint32_t>(b) : next++));
  }
  return t;
}

// ids: bytes 0-255, then "he" 256, "ll" 257, "hell" 258, "<s>" 259, "</s>" 260, "<s>x" 261.
std::string write_vocab(const TempDir& dir, const std::string& model = "gpt2") {
  auto tokens = byte_tokens();
  for (const char* t : {"he", "ll", "hell", "<s>", "</s>", "<s>x"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[259] = types[260] = types[261] = 3;
  GgufTestWriter w;
  w.kv_str("tokenizer.ggml.model", model);
  w.kv_strs("tokenizer.ggml.tokens", tokens);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_strs("tokenizer.ggml.merges", {"h e", "l l", "he ll"});
  w.kv_u32("tokenizer.ggml.bos_token_id", 259);
  w.kv_u32("tokenizer.ggml.eos_token_id", 260);
  w.kv_bool("tokenizer.ggml.add_bos_token", false);  // transformers adds BOS regardless
  const std::string path = dir.file("vocab.gguf");
  w.write(path);
  return path;
}

TEST(LlamaTokenizer, MergesByRankAndMatchesSpecialTokensFirst) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  const int64_t sp = ' ';  // ids 0-255 are the bytes; ' ' is spelled U+0120 in the vocabulary
  ASSERT_EQ(tok.decode({sp}), " ");
  // "hello" -> h e l l o -> he l l o -> he ll o -> hell o; the leading space stays its own token.
  EXPECT_EQ(tok.encode("hello hello"),
            (std::vector<int64_t>{259, 258, 'o', sp, 258, 'o'}));
  // Special tokens split the text before the words do; the longest one wins.
  EXPECT_EQ(tok.encode("he<s>xhe</s>"), (std::vector<int64_t>{259, 256, 261, 256, 260}));
  EXPECT_EQ(tok.encode(""), (std::vector<int64_t>{259}));
  EXPECT_EQ(tok.bos_token_id(), 259);
  EXPECT_EQ(tok.eos_token_id(), 260);
}

TEST(LlamaTokenizer, DecodeInvertsEncodeForAnyBytes) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  const std::string text = "hello, w\xC3\xB6rld\n\t 42 \xF0\x9F\x99\x82 \xFF";
  auto ids = tok.encode(text);
  EXPECT_EQ(tok.decode(ids), "<s>" + text);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), text);
}

TEST(LlamaTokenizer, HfJsonExportEncodesTheSame) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  std::ofstream(dir.file("tokenizer.json")) << tok.to_hf_json().dump();
  const auto back = LlamaTokenizer::from_hf_json(dir.file("tokenizer.json"));
  for (const char* s : {"hello hello", "he<s>xhe</s>", "a  b\n\nc 123"})
    EXPECT_EQ(back.encode(s), tok.encode(s)) << s;
  EXPECT_EQ(back.bos_token_id(), 259);
}

// tokenizer.json of `tok` with `edit` applied, written to dir/name.
std::string edited_json(const TempDir& dir, const LlamaTokenizer& tok, const std::string& name,
                        const std::function<void(nlohmann::json&)>& edit) {
  auto j = tok.to_hf_json();
  edit(j);
  std::ofstream(dir.file(name)) << j.dump();
  return dir.file(name);
}

TEST(LlamaTokenizer, HfJsonPreTokenizersIgnoreMergesAndRefusals) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  // SmolLM's Digits + ByteLevel: digits split one by one before BPE.
  const auto digits = LlamaTokenizer::from_hf_json(edited_json(dir, tok, "d.json", [](auto& j) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}},
                                             j["pre_tokenizer"]}}};
  }));
  EXPECT_EQ(digits.to_hf_json()["pre_tokenizer"]["pretokenizers"][0]["type"], "Digits");
  // ignore_merges: a word the vocabulary holds whole is one token, even without its merges.
  const auto whole = LlamaTokenizer::from_hf_json(edited_json(dir, tok, "w.json", [](auto& j) {
    j["model"]["ignore_merges"] = true;
    j["model"]["merges"] = nlohmann::json::array();
  }));
  EXPECT_EQ(whole.encode("hell"), (std::vector<int64_t>{259, 258}));  // BOS, the whole word
  EXPECT_EQ(whole.encode("hello"), (std::vector<int64_t>{259, 'h', 'e', 'l', 'l', 'o'}));

  EXPECT_THROW_WITH(
      LlamaTokenizer::from_hf_json(edited_json(dir, tok, "m.json", [](auto& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
      })),
      NotSupportedError, "m.json: pre_tokenizer is {\"replacement\"");
  EXPECT_THROW_WITH(LlamaTokenizer::from_hf_json(edited_json(dir, tok, "n.json", [](auto& j) {
                      j["normalizer"] = {{"type", "NFC"}};
                    })),
                    NotSupportedError, "n.json: normalizer is {\"type\":\"NFC\"}");
  EXPECT_THROW_WITH(LlamaTokenizer::from_hf_json(edited_json(dir, tok, "p.json", [](auto& j) {
                      j["post_processor"] = {{"type", "BertProcessing"}};
                    })),
                    NotSupportedError, "post_processor {\"type\":\"BertProcessing\"}");
}

TEST(LlamaTokenizer, RejectsOtherTokenizerModels) {
  TempDir dir;
  EXPECT_THROW_WITH(LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir, "llama"))),
                    ModelFileError, "tokenizer.ggml.model is 'llama'");
}

}  // namespace
}  // namespace deepspeed::examples

// Byte-level BPE from GGUF metadata on a tiny vocabulary: merges by rank, special tokens matched
// before pre-tokenization, BOS prepended, decode inverting encode, and the tokenizer.json export
// read back to the same encoder; the NFC normalizer. (Parity with transformers on the real
// vocabulary is in tests/e2e/llama_parity_test.cpp.)
#include "llama_tokenizer.h"

#include <cstdio>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>

#include "gguf_file.h"
#include "gguf_test_writer.h"
#include "merges_from_scores.h"
#include "unicode_nfc.h"
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
  // The lone \xFF is no UTF-8: decoded as U+FFFD, as tokenizers' ByteLevel decoder does.
  const std::string back = text.substr(0, text.size() - 1) + "\xEF\xBF\xBD";
  EXPECT_EQ(tok.decode(ids), "<s>" + back);
  EXPECT_EQ(tok.decode(ids, /*skip_special=*/true), back);
}

// Bytes that form no UTF-8 (a generation stopped inside a character, or bytes a model emits in
// an impossible order) decode as Python's bytes.decode("utf-8", "replace") and Rust's
// from_utf8_lossy do: one U+FFFD per maximal ill-formed subpart.
TEST(LlamaTokenizer, DecodeReplacesIllFormedUtf8AsTransformers) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  const auto ids_of = [](const std::string& s) {  // ids 0-255 are the bytes
    std::vector<int64_t> ids;
    for (unsigned char c : s) ids.push_back(c);
    return ids;
  };
  const std::string r = "\xEF\xBF\xBD";
  const std::pair<std::string, std::string> cases[] = {
      {"caf\xC3", "caf" + r},                 // cut inside a character
      {"\xE0\x80", r + r},                    // overlong: the lead byte alone, then the 80
      {"\xF0\x9F\x99", r},                    // a truncated emoji: one replacement
      {"\xF0\x9F\x99" "A", r + "A"},
      {"\xED\xA0\x80", r + r + r},            // a surrogate
      {"\xC0\xAF", r + r},
      {"\xF4\x90\x80\x80", r + r + r + r},     // past U+10FFFF
      {"ok \xF0\x9F\x99\x82", "ok \xF0\x9F\x99\x82"},  // well-formed stays as it is
  };
  for (const auto& [in, out] : cases) EXPECT_EQ(tok.decode(ids_of(in)), out) << in;
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
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}};
        j["pre_tokenizer"] = {{"replacement", "_"}, {"type", "Whitespace"}};
      })),
      NotSupportedError, "m.json: pre_tokenizer (after a normalizer) is {\"replacement\"");
  EXPECT_THROW_WITH(LlamaTokenizer::from_hf_json(edited_json(dir, tok, "n.json", [](auto& j) {
                      j["normalizer"] = {{"type", "NFKC"}};
                    })),
                    NotSupportedError, "n.json: normalizer is {\"type\":\"NFKC\"}");
  EXPECT_THROW_WITH(LlamaTokenizer::from_hf_json(edited_json(dir, tok, "p.json", [](auto& j) {
                      j["post_processor"] = {{"type", "BertProcessing"}};
                    })),
                    NotSupportedError, "post_processor {\"type\":\"BertProcessing\"}");
}

// Qwen2's NFC normalizer: composed and decomposed spellings encode alike, special tokens are
// matched in the text as it was, bytes that are not UTF-8 pass through.
TEST(LlamaTokenizer, NfcNormalizerComposesBeforeSplitting) {
  EXPECT_EQ(to_nfc("plain ascii", "t"), "plain ascii");
  EXPECT_EQ(to_nfc("e\xCC\x81 \xE2\x84\xAB", "t"), "\xC3\xA9 \xC3\x85");  // é, Å
  EXPECT_EQ(to_nfc("a\xCC\xA3\xCC\x81", "t"), to_nfc("a\xCC\x81\xCC\xA3", "t"));  // reordered
  EXPECT_EQ(to_nfc("e\xCC\x81\xFF" "e\xCC\x81", "t"), "\xC3\xA9\xFF\xC3\xA9");
  TempDir dir;
  const auto plain = LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir)));
  const auto nfc = LlamaTokenizer::from_hf_json(edited_json(dir, plain, "nfc.json", [](auto& j) {
    j["normalizer"] = {{"type", "NFC"}};
  }));
  EXPECT_EQ(nfc.to_hf_json()["normalizer"], (nlohmann::json{{"type", "NFC"}}));
  EXPECT_EQ(nfc.encode("e\xCC\x81"), plain.encode("\xC3\xA9"));
  EXPECT_NE(plain.encode("e\xCC\x81"), plain.encode("\xC3\xA9"));
  EXPECT_EQ(nfc.encode("<s>\xCC\x81"), plain.encode("<s>\xCC\x81"));  // nothing to compose with
  EXPECT_EQ(nfc.encode("hell\xFF"), plain.encode("hell\xFF"));
}

TEST(LlamaTokenizer, RejectsOtherTokenizerModels) {
  TempDir dir;
  EXPECT_THROW_WITH(LlamaTokenizer::from_gguf(GgufFile::open(write_vocab(dir, "bert"))),
                    ModelFileError, "tokenizer.ggml.model is 'bert'");
}

// A SentencePiece-style vocabulary laid out as Llama 2's: <unk> <s> </s>, the byte tokens
// <0x00>..<0xFF> (ids 3..258), then "▁" 259, "a" 260, "b" 261, "▁a" 262, "h" 263, "i" 264,
// "▁h" 265, "▁hi" 266. The expected ids below are what tokenizers 0.21 gives for this file.
const std::string kSpace = "\xE2\x96\x81";

std::string write_sentencepiece_json(const TempDir& dir, const std::string& name,
                                     const nlohmann::json& normalizer,
                                     const nlohmann::json& pre_tokenizer) {
  nlohmann::json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char t[8];
    std::snprintf(t, sizeof(t), "<0x%02X>", b);
    vocab[t] = 3 + b;
  }
  int id = 259;
  for (const std::string& t : {kSpace, std::string("a"), std::string("b"), kSpace + "a",
                              std::string("h"), std::string("i"), kSpace + "h", kSpace + "hi"}) {
    vocab[t] = id++;
  }
  nlohmann::json added = nlohmann::json::array();
  for (int i = 0; i < 3; ++i) {
    added.push_back({{"id", i}, {"content", i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>"},
                     {"special", true}, {"normalized", false}});
  }
  const nlohmann::json j = {
      {"added_tokens", added}, {"normalizer", normalizer}, {"pre_tokenizer", pre_tokenizer},
      {"post_processor", nullptr},
      {"model", {{"type", "BPE"}, {"unk_token", "<unk>"}, {"fuse_unk", true},
                 {"byte_fallback", true}, {"vocab", vocab},
                 {"merges", {kSpace + " a", kSpace + " h", kSpace + "h i"}}}}};
  std::ofstream(dir.file(name)) << j.dump();
  return dir.file(name);
}

nlohmann::json legacy_normalizer() {
  return {{"type", "Sequence"},
          {"normalizers", {{{"type", "Prepend"}, {"prepend", kSpace}},
                           {{"type", "Replace"}, {"pattern", {{"String", " "}}},
                            {"content", kSpace}}}}};
}

nlohmann::json metaspace(const char* scheme, bool split = false) {
  return {{"type", "Metaspace"}, {"replacement", kSpace}, {"prepend_scheme", scheme},
          {"split", split}};
}

using Ids = std::vector<int64_t>;

TEST(LlamaTokenizer, SentencePieceLegacyNormalizerPrependsToEveryPiece) {
  TempDir dir;
  const auto tok = LlamaTokenizer::from_hf_json(
      write_sentencepiece_json(dir, "l.json", legacy_normalizer(), nullptr));
  EXPECT_TRUE(tok.sentencepiece_style());
  EXPECT_EQ(tok.encode("hi a"), (Ids{266, 262}));
  EXPECT_EQ(tok.encode("<s>hi</s> hi"), (Ids{1, 266, 2, 259, 266}));  // "▁" prepended twice
  EXPECT_EQ(tok.encode(" hi"), (Ids{259, 266}));
  EXPECT_EQ(tok.encode("<s> "), (Ids{1, 259, 259}));
  EXPECT_EQ(tok.encode(""), Ids{});
  // A character the vocabulary lacks falls back to its bytes' tokens.
  EXPECT_EQ(tok.encode("\xC3\xA9"), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  // The decoder: "▁" reads as a space, the leading one stripped; a byte run that is not UTF-8
  // reads as one U+FFFD per byte token.
  EXPECT_EQ(tok.decode({266, 262}), "hi a");
  EXPECT_EQ(tok.decode({1, 3 + 0xC3, 3 + 0xA9, 262}, true), "\xC3\xA9 a");
  EXPECT_EQ(tok.decode({1, 3 + 0xC3, 3 + 0xA9, 3 + 0xC3, 260}, true),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "a");
  EXPECT_EQ(tok.decode_continuation({266}, {262}), " a");  // the space a word starts with stays
  const auto exported = tok.to_hf_json();
  EXPECT_EQ(exported["normalizer"], legacy_normalizer());
  EXPECT_EQ(exported["model"]["byte_fallback"], true);
  EXPECT_EQ(exported["decoder"]["decoders"][3]["type"], "Strip");
}

TEST(LlamaTokenizer, SentencePieceMetaspacePrependSchemesAndSplit) {
  TempDir dir;
  const auto first = LlamaTokenizer::from_hf_json(
      write_sentencepiece_json(dir, "f.json", nullptr, metaspace("first")));
  EXPECT_EQ(first.encode("<s>hi</s> hi"), (Ids{1, 263, 264, 2, 266}));  // not after <s>
  EXPECT_EQ(first.encode("hi a"), (Ids{266, 262}));
  EXPECT_EQ(first.encode(" hi"), (Ids{266}));  // a piece starting with "▁" gets no second one
  const auto always = LlamaTokenizer::from_hf_json(
      write_sentencepiece_json(dir, "a.json", nullptr, metaspace("always")));
  EXPECT_EQ(always.encode("<s>hi</s> hi"), (Ids{1, 266, 2, 266}));
  const auto never = LlamaTokenizer::from_hf_json(
      write_sentencepiece_json(dir, "n.json", nullptr, metaspace("never")));
  EXPECT_EQ(never.encode("hi a"), (Ids{263, 264, 262}));
  EXPECT_EQ(never.decode({262}), " a");  // nothing prepended, nothing stripped
  // split: each "▁" begins a word, so "▁" and "h" of "a▁▁hi" never meet in one merge.
  const auto split = LlamaTokenizer::from_hf_json(
      write_sentencepiece_json(dir, "s.json", nullptr, metaspace("always", true)));
  EXPECT_EQ(split.encode("a  hi"), (Ids{262, 259, 266}));
  EXPECT_EQ(split.to_hf_json()["pre_tokenizer"], metaspace("always", true));
  // tokenizers before 0.14 wrote add_prefix_space, and split was the default.
  auto old = metaspace("never");
  old.erase("prepend_scheme");
  old.erase("split");
  old["add_prefix_space"] = true;
  EXPECT_EQ(LlamaTokenizer::from_hf_json(write_sentencepiece_json(dir, "o.json", nullptr, old))
                .to_hf_json()["pre_tokenizer"],
            metaspace("always", true));
}

TEST(LlamaTokenizer, SentencePieceRefusesOtherNormalizers) {
  TempDir dir;
  EXPECT_THROW_WITH(LlamaTokenizer::from_hf_json(write_sentencepiece_json(
                        dir, "x.json", legacy_normalizer(), metaspace("first"))),
                    NotSupportedError, "x.json: normalizer (before a Metaspace pre-tokenizer)");
  auto nfkc = legacy_normalizer();
  nfkc["normalizers"].insert(nfkc["normalizers"].begin(),
                             nlohmann::json::object({{"type", "NFKC"}}));
  EXPECT_THROW_WITH(
      LlamaTokenizer::from_hf_json(write_sentencepiece_json(dir, "y.json", nfkc, nullptr)),
      NotSupportedError, "y.json: normalizer is {\"normalizers\":[{\"type\":\"NFKC\"}");
  auto other = legacy_normalizer();
  other["normalizers"][0]["prepend"] = "_";
  EXPECT_THROW_WITH(
      LlamaTokenizer::from_hf_json(write_sentencepiece_json(dir, "z.json", other, nullptr)),
      NotSupportedError, "z.json: normalizer prepends '_'");
}

// transformers' GGUFTokenizerSkeleton, on the same tokens and scores, makes these merges.
TEST(LlamaTokenizer, MergesFromScoresAsTransformersMakesThem) {
  // Cuts of one token go by (left score, right score), highest first ("xyz": both lefts 0);
  // tokens by their score, equal scores in vocabulary order; cuts between code points only.
  const std::vector<std::string> tokens = {"a", "b", "ab", "ba", "aba", "bab", "c", "abab",
                                           "\xC3\xA9", "a\xC3\xA9", "x", "y", "z", "xy",
                                           "yz", "xyz"};
  const std::vector<double> scores = {0, 0, -1, -1, -3, -3, 0, -2, 0, -1, 0, 0, -5, 0, -1, -4};
  const std::vector<std::pair<std::string, std::string>> want = {
      {"x", "y"}, {"a", "b"}, {"b", "a"}, {"a", "\xC3\xA9"}, {"y", "z"}, {"a", "bab"},
      {"ab", "ab"}, {"aba", "b"}, {"a", "ba"}, {"ab", "a"}, {"b", "ab"}, {"ba", "b"},
      {"x", "yz"}, {"xy", "z"}};
  EXPECT_EQ(merges_from_scores(tokens, scores), want);
}

TEST(LlamaTokenizer, GgufSentencePieceVocabularyWithoutMerges) {
  TempDir dir;
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) {
    char t[8];
    std::snprintf(t, sizeof(t), "<0x%02X>", b);
    tokens.push_back(t);
  }
  for (const std::string& t : {kSpace, std::string("h"), std::string("i"), kSpace + "h",
                              kSpace + "hi"}) {
    tokens.push_back(t);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  types[0] = 2;
  types[1] = types[2] = 3;
  GgufTestWriter w;
  w.kv_str("tokenizer.ggml.model", "llama");
  w.kv_strs("tokenizer.ggml.tokens", tokens);
  w.kv_i32s("tokenizer.ggml.token_type", types);
  w.kv_f32s("tokenizer.ggml.scores", std::vector<float>(tokens.size(), 0.0f));
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_u32("tokenizer.ggml.unknown_token_id", 0);
  w.write(dir.file("spm.gguf"));
  const auto tok = LlamaTokenizer::from_gguf(GgufFile::open(dir.file("spm.gguf")));
  EXPECT_TRUE(tok.sentencepiece_style());
  EXPECT_EQ(tok.encode("hi hi"), (Ids{1, 263, 263}));  // BOS, "▁hi" twice
  EXPECT_EQ(tok.decode(tok.encode("hi hi"), true), "hi hi");
}

// A 'phi3' GGUF with a byte-level vocabulary (Phi-4-mini's) as llama.cpp reads it: GPT-4o's
// split pattern ("helloWorld" is two words, so the merge "o W" never applies; GPT-2's pattern
// would merge across), control tokens special, BOS only with add_bos_token. Another
// tokenizer.ggml.pre is refused by name.
TEST(LlamaTokenizer, GgufPhi3ByteLevelVocabularySplitsAsGpt4o) {
  TempDir dir;
  auto tokens = byte_tokens();
  for (const char* t : {"he", "ll", "hell", "oW", "<|endoftext|>"}) tokens.push_back(t);
  std::vector<int32_t> types(tokens.size(), 1);
  types[260] = 3;
  const auto write = [&](const std::string& pre, bool add_bos, uint32_t bos = 260) {
    GgufTestWriter w;
    w.kv_str("general.architecture", "phi3");
    w.kv_str("tokenizer.ggml.model", "gpt2");
    w.kv_str("tokenizer.ggml.pre", pre);
    w.kv_strs("tokenizer.ggml.tokens", tokens);
    w.kv_i32s("tokenizer.ggml.token_type", types);
    w.kv_strs("tokenizer.ggml.merges", {"o W", "h e", "l l", "he ll"});
    w.kv_u32("tokenizer.ggml.bos_token_id", bos);
    w.kv_u32("tokenizer.ggml.eos_token_id", 260);
    w.kv_bool("tokenizer.ggml.add_bos_token", add_bos);
    w.write(dir.file("phi4.gguf"));
    return GgufFile::open(dir.file("phi4.gguf"));
  };
  const auto tok = LlamaTokenizer::from_gguf(write("gpt-4o", false));
  EXPECT_FALSE(tok.sentencepiece_style());
  const Ids hello_world = {258, 'o', 'W', 'o', 'r', 'l', 'd'};  // "hell" "o" | "W" "o" "r" ...
  EXPECT_EQ(tok.encode("helloWorld"), hello_world);
  Ids with_special = hello_world;
  with_special.push_back(260);
  EXPECT_EQ(tok.encode("helloWorld<|endoftext|>"), with_special);
  with_special.insert(with_special.begin(), 260);
  EXPECT_EQ(LlamaTokenizer::from_gguf(write("llama4", true)).encode("helloWorld<|endoftext|>"),
            with_special);
  EXPECT_THROW_WITH(LlamaTokenizer::from_gguf(write("gpt-2", false)), NotSupportedError,
                    "tokenizer.ggml.pre is 'gpt-2' on a 'phi3' model with a byte-level "
                    "vocabulary; finetune_llama reads Phi-4-mini's 'gpt-4o'");
  EXPECT_THROW_WITH(LlamaTokenizer::from_gguf(write("gpt-4o", true, 999)), ModelFileError,
                    "tokenizer.ggml.bos_token_id is 999, outside the vocabulary of 261");
}

}  // namespace
}  // namespace deepspeed::examples

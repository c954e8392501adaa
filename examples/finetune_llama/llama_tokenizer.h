// The BPE tokenizer of a Llama model, in either of the two kinds Llama-architecture models use:
// - byte-level (GPT-2 style: SmolLM2, Llama 3, Qwen2): from GGUF metadata (tokenizer.ggml.model
//   "gpt2") or a tokenizer.json with a pre-tokenizer of word_split.h; the text is split into words
//   (for a GGUF as transformers' GGUF loader splits: Qwen2's pattern after NFC for a "qwen2"
//   model, else GPT-2's) whose bytes are merged. tokenizer.json's NFC normalizer (Qwen2's) is
//   applied first (unicode_nfc.h);
// - SentencePiece-style (Llama 2, Mistral, TinyLlama): from GGUF metadata (tokenizer.ggml.model
//   "llama": merges made from the scores as transformers makes them) or a tokenizer.json with the
//   normalizer or pre-tokenizer of metaspace.h; spaces become "▁", characters are merged,
//   and one the vocabulary lacks falls back to its bytes' <0xXX> tokens (byte_fallback).
// Encodes as Hugging Face tokenizers does with transformers' default special-token handling:
// special tokens in the text are matched first (longest first), the rest is made into words and
// merged by rank (with tokenizer.json's ignore_merges, a word the vocabulary holds whole is one
// token), and the template's prefix (the BOS token for a GGUF) is prepended.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "bpe_merge.h"
#include "metaspace.h"
#include "word_split.h"

namespace deepspeed::examples {

class GgufFile;

class LlamaTokenizer {
 public:
  /// From GGUF metadata. transformers' GGUF loader makes a LlamaTokenizerFast, which adds the
  /// BOS token (tokenizer.ggml.bos_token_id) in front of every text whatever
  /// tokenizer.ggml.add_bos_token says; this does the same. For general.architecture "qwen2" it
  /// makes Qwen2TokenizerFast (NFC, Qwen2's pattern, no BOS). Throws ModelFileError naming the
  /// file and key for a missing key, a model other than "gpt2" and "llama" or a merge of unknown
  /// tokens.
  static LlamaTokenizer from_gguf(const GgufFile& file);
  /// From a Hugging Face tokenizer.json at `path`. Throws NotSupportedError naming the file for a
  /// normalizer (other than NFC) or pre-tokenizer neither word_split.h nor metaspace.h knows, or
  /// a post-processor other than TemplateProcessing and ByteLevel (alone or in a Sequence).
  static LlamaTokenizer from_hf_json(const std::string& path);

  /// Token ids of `text` (UTF-8), template prefix/suffix included.
  std::vector<int64_t> encode(std::string_view text) const;
  /// The text of `ids`; with skip_special, special tokens are left out. SentencePiece-style: a
  /// run of <0xXX> tokens that is not UTF-8 reads as one U+FFFD each, and the leading space the
  /// prepended "▁" makes is stripped, as transformers' Llama decoder does.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  /// The text `generated` adds to `prompt` (special tokens left out): the decoded whole less the
  /// decoded prompt, so that a word's leading space survives the decoder's strip.
  std::string decode_continuation(const std::vector<int64_t>& prompt,
                                  const std::vector<int64_t>& generated) const;
  bool sentencepiece_style() const { return metaspace_.has_value(); }

  size_t vocab_size() const { return token_bytes_.size(); }
  int64_t bos_token_id() const { return bos_id_; }
  int64_t eos_token_id() const { return eos_id_; }
  /// A tokenizer.json (plus the tokenizer_config.json that goes with it) that transformers loads
  /// to a tokenizer encoding exactly as this one.
  nlohmann::json to_hf_json() const;
  nlohmann::json hf_tokenizer_config(int64_t model_max_length) const;

 private:
  using MergeList = std::vector<std::pair<std::string, std::string>>;
  static LlamaTokenizer qwen2_from_gguf(const GgufFile& f, const std::vector<std::string>& tokens,
                                        const MergeList& merges);
  static LlamaTokenizer llama_cpp_byte_level(const GgufFile& f,
                                             const std::vector<std::string>& tokens,
                                             const MergeList& merges, WordSplit split);
  void build(const std::vector<std::string>& tokens, const MergeList& merges,
             const std::vector<int64_t>& special_ids, const std::string& source);
  void encode_word(std::string_view word, std::vector<int64_t>* out) const;
  // The word's symbols before merging: its bytes (byte-level) or characters (SentencePiece),
  // each a vocabulary token, else its bytes' <0xXX> tokens (byte_fallback), else unknown.
  void initial_symbols(std::string_view word, std::vector<int64_t>* ids) const;
  int64_t whole_word_id(std::string_view word) const;
  std::string decode_sentencepiece(const std::vector<int64_t>& ids, bool skip_special) const;

  std::optional<Metaspace> metaspace_;      // set for a SentencePiece-style tokenizer
  std::vector<std::string> token_strings_;  // as in the vocabulary
  std::vector<std::string> token_bytes_;    // decoded text (special tokens: their text)
  std::vector<int16_t> byte_value_;         // SentencePiece: the byte of a <0xXX> token, else -1
  MergeList merge_list_;                    // rank order
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int64_t> bytes_vocab_;  // raw bytes -> id, special tokens aside
  WordSplit split_ = WordSplit::kGpt2;
  bool nfc_ = false;  // tokenizer.json's NFC normalizer (Qwen2): text between special tokens
  bool ignore_merges_ = false;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  MergeTable merges_;
  int64_t byte_token_[256] = {};           // byte-level: the token of each byte's code point
  int64_t byte_fallback_token_[256] = {};  // the <0xXX> token of each byte, or -1
  std::vector<int64_t> special_ids_;   // matched in text before pre-tokenization
  std::vector<bool> is_special_;
  std::vector<int64_t> prefix_, suffix_;  // the post-processor's template around the text
  int64_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, pad_id_ = -1;
  // Words seen before and their ids: a corpus repeats a few thousand words (20x faster on Austen).
  // Long words (a SentencePiece tokenizer's whole lines) are not kept.
  struct WordCache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int64_t>> ids;
  };
  std::shared_ptr<WordCache> cache_ = std::make_shared<WordCache>();
};

}  // namespace deepspeed::examples

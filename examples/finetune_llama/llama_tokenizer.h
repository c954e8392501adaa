// The byte-level BPE tokenizer of a Llama model (GPT-2 style, as SmolLM2 and Llama 3 use), built
// from GGUF metadata (tokenizer.ggml.tokens / merges / token_type, model "gpt2") or from a
// Hugging Face tokenizer.json (BPE model; the pre-tokenizers of word_split.h). Encodes as
// transformers' fast tokenizer does with its default special-token handling: special tokens in
// the text are matched first (longest first), the rest is split into words (GPT-2's pattern for a
// GGUF, as transformers' GGUF loader does; tokenizer.json's pre-tokenizer otherwise) and merged
// by rank (with tokenizer.json's ignore_merges, a word the vocabulary holds whole is one token),
// and the template's prefix (the BOS token for a GGUF) is prepended.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "word_split.h"

namespace deepspeed::examples {

class GgufFile;

class LlamaTokenizer {
 public:
  /// From GGUF metadata. transformers' GGUF loader makes a LlamaTokenizerFast, which adds the
  /// BOS token (tokenizer.ggml.bos_token_id) in front of every text whatever
  /// tokenizer.ggml.add_bos_token says; this does the same. Throws ModelFileError naming the file
  /// and key for a missing key, a model other than "gpt2" or a merge of unknown tokens.
  static LlamaTokenizer from_gguf(const GgufFile& file);
  /// From a Hugging Face tokenizer.json at `path`. Throws NotSupportedError naming the file for a
  /// normalizer, a pre-tokenizer word_split.h does not know, or a post-processor other than
  /// TemplateProcessing and ByteLevel (alone or in a Sequence).
  static LlamaTokenizer from_hf_json(const std::string& path);

  /// Token ids of `text` (UTF-8), template prefix/suffix included.
  std::vector<int64_t> encode(std::string_view text) const;
  /// The text of `ids`; with skip_special, special tokens are left out.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;

  size_t vocab_size() const { return token_bytes_.size(); }
  int64_t bos_token_id() const { return bos_id_; }
  int64_t eos_token_id() const { return eos_id_; }
  /// A tokenizer.json (plus the tokenizer_config.json that goes with it) that transformers loads
  /// to a tokenizer encoding exactly as this one.
  nlohmann::json to_hf_json() const;
  nlohmann::json hf_tokenizer_config(int64_t model_max_length) const;

 private:
  void build(const std::vector<std::string>& tokens, const std::vector<std::string>& merges,
             const std::vector<int64_t>& special_ids, const std::string& source);
  void encode_word(std::string_view word, std::vector<int64_t>* out) const;

  std::vector<std::string> token_strings_;  // as in the vocabulary (GPT-2's byte alphabet)
  std::vector<std::string> token_bytes_;    // raw bytes (special tokens: their text)
  std::vector<std::string> merge_list_;     // "left right", rank order
  std::unordered_map<std::string, int64_t> vocab_;
  std::unordered_map<std::string, int64_t> bytes_vocab_;  // raw bytes -> id, special tokens aside
  WordSplit split_ = WordSplit::kGpt2;
  bool ignore_merges_ = false;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (l << 32 | r) -> rank, id
  int64_t byte_token_[256] = {};
  std::vector<int64_t> special_ids_;   // matched in text before pre-tokenization
  std::vector<bool> is_special_;
  std::vector<int64_t> prefix_, suffix_;  // the post-processor's template around the text
  int64_t bos_id_ = -1, eos_id_ = -1, unk_id_ = -1, pad_id_ = -1;
  // Words seen before and their ids: a corpus repeats a few thousand words (20x faster on Austen).
  struct WordCache {
    std::mutex mutex;
    std::unordered_map<std::string, std::vector<int64_t>> ids;
  };
  std::shared_ptr<WordCache> cache_ = std::make_shared<WordCache>();
};

}  // namespace deepspeed::examples

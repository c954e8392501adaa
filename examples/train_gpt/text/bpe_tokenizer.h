// GPT-2's byte-level BPE tokenizer over OpenAI's published vocabulary files (encoder.json +
// vocab.bpe). Owns encoding and decoding; the word splitting is in pretokenizer.h, and special
// tokens are not parsed from text (callers insert eot_token() between documents themselves).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sha256.h"

namespace deepspeed::examples {

class BpeTokenizer {
 public:
  // Loads the vocabulary. encoder_json maps each token (bytes spelled in GPT-2's printable byte
  // alphabet) to its id; vocab_bpe lists the merges in rank order after a "#version" line.
  // Throws std::runtime_error naming the file (and line) when a file is missing or malformed,
  // e.g. a merge whose parts or result are not in encoder.json.
  static BpeTokenizer from_files(const std::string& encoder_json, const std::string& vocab_bpe);

  // The committed GPT-2 files in third_party/gpt2_bpe (path fixed at build time, DS_GPT2_BPE_DIR).
  static BpeTokenizer from_default_files();

  // Token ids of `text` (any bytes; invalid UTF-8 is encoded byte by byte). Identical to GPT-2's
  // encoder, including "<|endoftext|>" in text being encoded as ordinary characters.
  // Thread-safe: the word cache is guarded by a mutex, so concurrent calls serialize.
  std::vector<int32_t> encode(std::string_view text) const;

  // The bytes of `ids` concatenated; decode(encode(s)) == s for every s. The result may end in
  // the middle of a UTF-8 sequence if `ids` was cut there. Throws std::out_of_range on an id
  // outside [0, vocab_size()).
  std::string decode(const std::vector<int32_t>& ids) const;

  // "<|endoftext|>", 50256 for GPT-2.
  int32_t eot_token() const { return eot_token_; }
  // Number of ids, 50257 for GPT-2 (50000 merges + 256 bytes + eot).
  size_t vocab_size() const { return token_bytes_.size(); }
  // SHA-256 over encoder.json's bytes followed by vocab.bpe's: identifies the vocabulary in
  // caches of token ids (see token_dataset.h).
  const Sha256Digest& vocab_sha256() const { return vocab_sha256_; }

  BpeTokenizer(BpeTokenizer&&) noexcept;
  BpeTokenizer& operator=(BpeTokenizer&&) noexcept;
  ~BpeTokenizer();

 private:
  BpeTokenizer();
  // BPE of one pre-tokenized word (raw bytes), appended to *out.
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;

  struct Merge {
    int32_t rank;
    int32_t result;
  };
  struct WordCache;

  std::vector<std::string> token_bytes_;        // id -> raw bytes
  int32_t byte_token_[256] = {};                // byte value -> id of the 1-byte token
  std::unordered_map<uint64_t, Merge> merges_;  // (left id << 32 | right id) -> merge
  int32_t eot_token_ = -1;
  Sha256Digest vocab_sha256_{};
  std::unique_ptr<WordCache> cache_;
};

}  // namespace deepspeed::examples

// How a SentencePiece-style BPE (Llama 2, Mistral, TinyLlama, a GGUF whose tokenizer.ggml.model
// is "llama") makes the words it merges: spaces become "▁", a "▁" goes in front, and the text is
// one word, or (Metaspace with split) a word begins at each "▁". tokenizer.json spells it in two
// ways, both recognised and written back here: the older normalizer Sequence[Prepend("▁"),
// Replace(" ", "▁")] with no pre-tokenizer (transformers' "legacy" Llama tokenizers), or the
// Metaspace pre-tokenizer with its prepend_scheme. They differ at the edges: the normalizer
// prepends to every piece of text between special tokens, even one starting with a space;
// Metaspace only to a piece not starting with "▁", and with "first" only at the text's start.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace deepspeed::examples {

struct Metaspace {
  enum class Form { kNormalizer, kPreTokenizer };
  enum class Prepend { kAlways, kFirst, kNever };

  Form form = Form::kNormalizer;
  Prepend prepend = Prepend::kAlways;
  bool split = false;                 // Metaspace's split: a word begins at each replacement
  std::string replacement = "\xE2\x96\x81";  // "▁"

  /// From tokenizer.json's `normalizer` and `pre_tokenizer`: nullopt when the normalizer is null
  /// and the pre-tokenizer is not Metaspace (a byte-level tokenizer). Throws NotSupportedError
  /// naming `path` and showing the step for any other normalizer, or a Metaspace pre-tokenizer
  /// after a normalizer.
  static std::optional<Metaspace> from_hf_json(const nlohmann::json& normalizer,
                                               const nlohmann::json& pre_tokenizer,
                                               const std::string& path);
  nlohmann::json normalizer_json() const;
  nlohmann::json pre_tokenizer_json() const;
  /// Replace(replacement -> " "), ByteFallback, Fuse, and Strip of one leading space when a
  /// replacement is prepended: transformers' Llama decoder.
  nlohmann::json decoder_json() const;
  /// Whether decoding strips the one space the prepended replacement becomes.
  bool strips_leading_space() const { return prepend != Prepend::kNever; }

  /// Calls `word(std::string)` for each word of `piece`, a non-empty run of text between special
  /// tokens; `at_text_start` says whether it begins the text (Prepend::kFirst).
  template <class F>
  void for_each_word(std::string_view piece, bool at_text_start, F&& word) const;

 private:
  std::string replace_spaces(std::string_view piece) const;
};

template <class F>
void Metaspace::for_each_word(std::string_view piece, bool at_text_start, F&& word) const {
  if (piece.empty()) return;
  std::string s = replace_spaces(piece);
  const bool starts = s.compare(0, replacement.size(), replacement) == 0;
  const bool add = form == Form::kNormalizer
                       ? prepend != Prepend::kNever
                       : !starts && (prepend == Prepend::kAlways ||
                                     (prepend == Prepend::kFirst && at_text_start));
  if (add) s.insert(0, replacement);
  if (!split) {
    word(std::move(s));
    return;
  }
  // Split "merged with next": each replacement starts a word.
  size_t start = 0;
  for (size_t p = s.find(replacement, 1); p != std::string::npos;
       p = s.find(replacement, p + replacement.size())) {
    if (p > start) word(s.substr(start, p - start));
    start = p;
  }
  word(s.substr(start));
}

}  // namespace deepspeed::examples

// How a byte-level BPE tokenizer splits text into words before merging: the pre-tokenizers of
// tokenizer.json that the Llama-architecture models finetune_llama reads use. Owns recognising
// them in tokenizer.json, writing them back, and the split itself (the patterns are
// pretokenizer.h's).
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "pretokenizer.h"
#include "unicode_classes.h"

namespace deepspeed::examples {

enum class WordSplit {
  kGpt2,                  // ByteLevel with its regex: GPT-2's pattern (GGUF files, our exports)
  kGpt2IndividualDigits,  // Digits(individual_digits) then ByteLevel: SmolLM and SmolLM2
  kLlama3,                // Split(Llama 3's pattern) then ByteLevel without regex: Llama 3
  kQwen2,                 // the same pattern with single digits
  kO200k,                 // Split(GPT-4o's pattern) then ByteLevel without regex: Phi-4-mini
  kTekken,                // the same pattern without contractions, single digits: Mistral NeMo
  kDeepSeekV3,            // Split(numbers), Split(kana and ideographs), Split(its pattern), then
                          // ByteLevel without regex: DeepSeek-V3
};

/// From tokenizer.json's `pre_tokenizer`. Throws NotSupportedError naming `path` and showing the
/// pre-tokenizer for any other (a prefix space, another pattern, another sequence).
WordSplit word_split_from_hf_json(const nlohmann::json& pre_tokenizer, const std::string& path);
/// tokenizer.json's `pre_tokenizer` for `split`.
nlohmann::json word_split_to_hf_json(WordSplit split);

/// Calls `word(view)` for each word of `text`, in order; the words tile the text.
template <class F>
void for_each_word(WordSplit split, std::string_view text, F&& word) {
  auto split_with = [&](std::string_view piece, auto word_end) {
    for (size_t p = 0; p < piece.size();) {
      const size_t e = word_end(piece, p);
      word(piece.substr(p, e - p));
      p = e;
    }
  };
  switch (split) {
    case WordSplit::kGpt2:
      split_with(text, [](std::string_view t, size_t p) { return gpt2_word_end(t, p); });
      return;
    case WordSplit::kLlama3:
      split_with(text, [](std::string_view t, size_t p) { return llama3_word_end(t, p, 3); });
      return;
    case WordSplit::kQwen2:
      split_with(text, [](std::string_view t, size_t p) { return llama3_word_end(t, p, 1); });
      return;
    case WordSplit::kO200k:
      split_with(text, [](std::string_view t, size_t p) { return o200k_word_end(t, p); });
      return;
    case WordSplit::kTekken:
      split_with(text, [](std::string_view t, size_t p) { return o200k_word_end(t, p, 1, false); });
      return;
    case WordSplit::kDeepSeekV3:
      split_with(text, [](std::string_view t, size_t p) { return deepseek_v3_word_end(t, p); });
      return;
    case WordSplit::kGpt2IndividualDigits: {
      // Every number code point is a word of its own; GPT-2's pattern splits the text between.
      size_t start = 0;
      for (size_t p = 0; p < text.size();) {
        char32_t cp;
        const size_t n = detail::decode_utf8(text, p, &cp);
        if (detail::char_class(cp) == detail::CharClass::kNumber) {
          split_with(text.substr(start, p - start),
                     [](std::string_view t, size_t q) { return gpt2_word_end(t, q); });
          word(text.substr(p, n));
          start = p + n;
        }
        p += n;
      }
      split_with(text.substr(start),
                 [](std::string_view t, size_t q) { return gpt2_word_end(t, q); });
      return;
    }
  }
}

}  // namespace deepspeed::examples

// GPT-2's pre-tokenizer: splits text into the "words" that byte-level BPE then encodes one by
// one. Owns the splitting rules only (no vocabulary).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace deepspeed::examples {

// Returns the end (exclusive byte offset) of the word that starts at `pos` (< text.size()).
// Equivalent to one match of GPT-2's pattern, scanned by hand over UTF-8 code points:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// Every code point is a letter, a number, a space or "other", so the words tile the text with
// no gaps: concatenating them gives the input back. Bytes that are not valid UTF-8 count as
// "other" one byte at a time (see unicode_classes.h).
size_t gpt2_word_end(std::string_view text, size_t pos);

// All words of `text`, as views into it.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

// The same for Llama 3's pattern (tokenizer.json's Split pre-tokenizer, llama3_pretokenizer.cpp):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//   ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Unlike GPT-2's: contractions in any case, one leading space or symbol joins a run of letters,
// numbers go in groups of at most `max_digits` (3; Qwen2's variant of the pattern has 1), and
// line breaks close a run of symbols or whitespace.
size_t llama3_word_end(std::string_view text, size_t pos, int max_digits = 3);

// The same for GPT-4o's pattern (o200k; Phi-4-mini's tokenizer.json,
// o200k_pretokenizer.cpp), with U = [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}],
// L = [\p{Ll}\p{Lm}\p{Lo}\p{M}] and C = (?i:'s|'t|'re|'ve|'m|'ll|'d):
//   [^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// A word is a run of capitals and the small letters after them ("HTTPServer" is one word,
// "helloWorld" two), a contraction stays on its word, and a run of symbols takes the line breaks
// and slashes after it. Mistral's Tekken pattern is the same without C and with single digits
// (`contractions` false, `max_digits` 1).
size_t o200k_word_end(std::string_view text, size_t pos, int max_digits = 3,
                      bool contractions = true);

// The same for DeepSeek-V3's pre-tokenizer (its tokenizer.json's three Splits in sequence,
// deepseek_v3_pretokenizer.cpp): numbers in groups of at most three (\p{N}{1,3}), then runs of
// kana and CJK ideographs ([一-龥぀-ゟ゠-ヿ]+), then within each piece those left
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//    ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// An ASCII symbol keeps the ASCII letters after it, marks join letters, and a stretch that no
// alternative matches (control or format characters) is a word of its own.
size_t deepseek_v3_word_end(std::string_view text, size_t pos);

}  // namespace deepspeed::examples

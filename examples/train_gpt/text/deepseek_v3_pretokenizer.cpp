// Hand-written matcher for DeepSeek-V3's pre-tokenizer (see pretokenizer.h): three Split
// stages in cascade, each one isolating its matches and the stretches between them within every
// piece the stage before left, the last pattern's alternatives in order as a backtracking regex
// engine (Oniguruma, which Hugging Face tokenizers runs it on) resolves them.
#include "pretokenizer.h"

#include "pattern_pieces.h"

namespace deepspeed::examples {
namespace {

using detail::char_class;
using detail::CharClass;
using detail::decode_utf8;
using detail::is_line_break;
using detail::is_mark;
using detail::is_punctuation_or_symbol;

// The second stage's [一-龥぀-ゟ゠-ヿ]+: CJK ideographs to U+9FA5, hiragana and katakana.
bool is_kana_or_ideograph(char32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x30FF);
}

bool is_letter_or_mark(char32_t cp) { return char_class(cp) == CharClass::kLetter || is_mark(cp); }

bool is_ascii_letter(char32_t cp) { return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z'; }

// The end of the run of code points starting at pos that satisfy `in`.
template <class In>
size_t run_end(std::string_view text, size_t pos, In in) {
  char32_t cp;
  while (pos < text.size()) {
    const size_t n = decode_utf8(text, pos, &cp);
    if (!in(cp)) break;
    pos += n;
  }
  return pos;
}

// [^\r\n\p{L}\p{P}\p{S}]: what may lead a run of letters and marks.
bool leads_letters(char32_t cp) {
  return !is_line_break(cp) && char_class(cp) != CharClass::kLetter &&
         !is_punctuation_or_symbol(cp);
}

// The third stage's pattern within one piece `text`, at pos:
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
//    ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Where no alternative matches, the stretch up to the next place one does is a word of its own.
size_t main_pattern_end(std::string_view text, size_t pos) {
  const size_t size = text.size();
  char32_t cp, next = 0;
  const size_t len = decode_utf8(text, pos, &cp);
  const bool has_next = pos + len < size;
  if (has_next) decode_utf8(text, pos + len, &next);
  // An ASCII symbol and the ASCII letters after it ("'s", ".com", "_init").
  if (cp < 128 && is_punctuation_or_symbol(cp) && has_next && is_ascii_letter(next)) {
    return run_end(text, pos + 1, is_ascii_letter);
  }
  // Letters and marks, led by at most one code point that is no line break, letter, punctuation
  // or symbol (a mark leading leaves the same run).
  if (is_letter_or_mark(cp)) return run_end(text, pos, is_letter_or_mark);
  if (leads_letters(cp) && has_next && is_letter_or_mark(next)) {
    return run_end(text, pos + len, is_letter_or_mark);
  }
  // Punctuation and symbols, led by at most one U+0020, then any line breaks.
  size_t start = size;
  if (is_punctuation_or_symbol(cp)) start = pos;
  if (cp == U' ' && has_next && is_punctuation_or_symbol(next)) start = pos + len;
  if (start != size) {
    return run_end(text, run_end(text, start, is_punctuation_or_symbol), is_line_break);
  }
  if (char_class(cp) == CharClass::kSpace) return detail::whitespace_end(text, pos);
  // Nothing matches at pos: neither a letter, mark, punctuation, symbol nor space, nor a lead
  // of letters. The stretch runs to the first code point where something matches.
  size_t end = pos + len;
  while (end < size) {
    const size_t n = decode_utf8(text, end, &cp);
    if (is_letter_or_mark(cp) || is_punctuation_or_symbol(cp) ||
        char_class(cp) == CharClass::kSpace) {
      break;
    }
    if (end + n < size) {
      decode_utf8(text, end + n, &next);
      if (leads_letters(cp) && is_letter_or_mark(next)) break;
    }
    end += n;
  }
  return end;
}

}  // namespace

size_t deepseek_v3_word_end(std::string_view text, size_t pos) {
  char32_t cp;
  decode_utf8(text, pos, &cp);
  // Stage 1: numbers in groups of at most three, which no later pattern splits further.
  if (char_class(cp) == CharClass::kNumber) return detail::digits_end(text, pos, 3);
  // Stage 2 leaves runs of kana and ideographs and the stretches between them and the numbers;
  // stage 3 sees one such piece at a time (its lookahead ends there).
  const bool cjk = is_kana_or_ideograph(cp);
  const size_t piece_end = run_end(text, pos, [cjk](char32_t c) {
    return char_class(c) != CharClass::kNumber && is_kana_or_ideograph(c) == cjk;
  });
  return main_pattern_end(text.substr(0, piece_end), pos);
}

}  // namespace deepspeed::examples

// The pieces that Llama 3's and GPT-4o's split patterns share (pretokenizer.h), each resolved as
// a backtracking regex engine (Oniguruma, which Hugging Face tokenizers runs them on) resolves
// it. Internal to the hand-written matchers.
#pragma once

#include <cstddef>
#include <string_view>

#include "unicode_classes.h"

namespace deepspeed::examples::detail {

inline bool is_line_break(char32_t cp) { return cp == U'\r' || cp == U'\n'; }

inline char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at pos: its end, or pos. Oniguruma matches case-insensitively by
// Unicode case folding, under which U+017F (long s) is an s as well.
inline size_t contraction_end(std::string_view text, size_t pos) {
  if (pos >= text.size() || text[pos] != '\'' || pos + 1 >= text.size()) return pos;
  if (text.compare(pos + 1, 2, "\xC5\xBF") == 0) return pos + 3;
  const char a = ascii_lower(text[pos + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
  if (pos + 2 < text.size()) {
    const char b = ascii_lower(text[pos + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  }
  return pos;
}

// The end of the run of code points of class `cls` starting at pos.
inline size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  char32_t cp;
  while (pos < text.size()) {
    const size_t n = decode_utf8(text, pos, &cp);
    if (char_class(cp) != cls) break;
    pos += n;
  }
  return pos;
}

// \p{N}{1,max_digits} at pos (a number there).
inline size_t digits_end(std::string_view text, size_t pos, int max_digits) {
  char32_t cp;
  for (int i = 0; i < max_digits && pos < text.size(); ++i) {
    const size_t n = decode_utf8(text, pos, &cp);
    if (char_class(cp) != CharClass::kNumber) break;
    pos += n;
  }
  return pos;
}

// " ?[^\s\p{L}\p{N}]+" followed by any code points of `tail` ("\r\n" for Llama 3's [\r\n]*,
// "\r\n/" for GPT-4o's [\r\n/]*): its end, or pos when it does not match at pos.
inline size_t symbols_end(std::string_view text, size_t pos, std::u32string_view tail) {
  char32_t cp, next = 0;
  const size_t len = decode_utf8(text, pos, &cp);
  const bool has_next = pos + len < text.size();
  if (has_next) decode_utf8(text, pos + len, &next);
  size_t start = text.size();
  if (char_class(cp) == CharClass::kOther) start = pos;
  if (cp == U' ' && has_next && char_class(next) == CharClass::kOther) start = pos + len;
  if (start == text.size()) return pos;
  size_t end = run_end(text, start, CharClass::kOther);
  while (end < text.size()) {
    const size_t n = decode_utf8(text, end, &cp);
    if (tail.find(cp) == std::u32string_view::npos) break;
    end += n;
  }
  return end;
}

// \s*[\r\n]+|\s+(?!\S)|\s+ at pos, which starts with whitespace.
inline size_t whitespace_end(std::string_view text, size_t pos) {
  const size_t size = text.size();
  char32_t cp;
  // \s*[\r\n]+ : the run up to its last line break.
  size_t end = pos, last_start = pos, after_break = pos;
  while (end < size) {
    const size_t n = decode_utf8(text, end, &cp);
    if (char_class(cp) != CharClass::kSpace) break;
    last_start = end;
    end += n;
    if (is_line_break(cp)) after_break = end;
  }
  if (after_break != pos) return after_break;
  // \s+(?!\S) then \s+ : as in GPT-2's pattern, a run before a non-space gives up its last code
  // point unless that is all of it.
  if (end == size) return end;
  return last_start > pos ? last_start : end;
}

}  // namespace deepspeed::examples::detail

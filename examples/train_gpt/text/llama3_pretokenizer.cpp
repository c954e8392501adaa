// Hand-written matcher for Llama 3's split pattern (see pretokenizer.h), in the manner of
// gpt2_word_end: the alternatives in the pattern's order, each as a backtracking regex engine
// (Oniguruma, which Hugging Face tokenizers runs it on) resolves it.
#include "pretokenizer.h"

#include "unicode_classes.h"

namespace deepspeed::examples {

using detail::char_class;
using detail::CharClass;
using detail::decode_utf8;

namespace {

bool is_line_break(char32_t cp) { return cp == U'\r' || cp == U'\n'; }

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at pos: its end, or pos.
size_t contraction_end(std::string_view text, size_t pos) {
  if (text[pos] != '\'' || pos + 1 >= text.size()) return pos;
  const char a = ascii_lower(text[pos + 1]);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
  if (pos + 2 < text.size()) {
    const char b = ascii_lower(text[pos + 2]);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return pos + 3;
  }
  return pos;
}

// The end of the run of code points of class `cls` starting at pos.
size_t run_end(std::string_view text, size_t pos, CharClass cls) {
  char32_t cp;
  while (pos < text.size()) {
    const size_t n = decode_utf8(text, pos, &cp);
    if (char_class(cp) != cls) break;
    pos += n;
  }
  return pos;
}

}  // namespace

size_t llama3_word_end(std::string_view text, size_t pos, int max_digits) {
  const size_t size = text.size();
  if (const size_t end = contraction_end(text, pos); end != pos) return end;

  char32_t cp;
  const size_t len = decode_utf8(text, pos, &cp);
  const CharClass cls = char_class(cp);
  char32_t next = 0;
  CharClass next_cls = CharClass::kOther;
  const bool has_next = pos + len < size;
  if (has_next) {
    decode_utf8(text, pos + len, &next);
    next_cls = char_class(next);
  }

  // [^\r\n\p{L}\p{N}]?\p{L}+ : letters, led by at most one code point that is neither a line
  // break, a letter nor a number.
  if (cls == CharClass::kLetter) return run_end(text, pos, CharClass::kLetter);
  if (cls != CharClass::kNumber && !is_line_break(cp) && has_next &&
      next_cls == CharClass::kLetter) {
    return run_end(text, pos + len, CharClass::kLetter);
  }

  // \p{N}{1,max_digits}
  if (cls == CharClass::kNumber) {
    size_t end = pos;
    for (int i = 0; i < max_digits && end < size; ++i) {
      const size_t n = decode_utf8(text, end, &cp);
      if (char_class(cp) != CharClass::kNumber) break;
      end += n;
    }
    return end;
  }

  //  ?[^\s\p{L}\p{N}]+[\r\n]* : symbols, led by at most one U+0020, then any line breaks.
  size_t symbols = cls == CharClass::kOther ? pos : size;
  if (cp == U' ' && has_next && next_cls == CharClass::kOther) symbols = pos + len;
  if (symbols != size) {
    size_t end = run_end(text, symbols, CharClass::kOther);
    while (end < size) {
      const size_t n = decode_utf8(text, end, &cp);
      if (!is_line_break(cp)) break;
      end += n;
    }
    return end;
  }

  // What is left starts with whitespace. \s*[\r\n]+ : the run up to its last line break.
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

}  // namespace deepspeed::examples

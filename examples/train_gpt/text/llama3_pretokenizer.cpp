// Hand-written matcher for Llama 3's split pattern (see pretokenizer.h), in the manner of
// gpt2_word_end: the alternatives in the pattern's order, each as a backtracking regex engine
// (Oniguruma, which Hugging Face tokenizers runs it on) resolves it.
#include "pretokenizer.h"

#include "pattern_pieces.h"

namespace deepspeed::examples {

using detail::char_class;
using detail::CharClass;
using detail::decode_utf8;

size_t llama3_word_end(std::string_view text, size_t pos, int max_digits) {
  const size_t size = text.size();
  if (const size_t end = detail::contraction_end(text, pos); end != pos) return end;

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
  if (cls == CharClass::kLetter) return detail::run_end(text, pos, CharClass::kLetter);
  if (cls != CharClass::kNumber && !detail::is_line_break(cp) && has_next &&
      next_cls == CharClass::kLetter) {
    return detail::run_end(text, pos + len, CharClass::kLetter);
  }
  // \p{N}{1,max_digits}
  if (cls == CharClass::kNumber) return detail::digits_end(text, pos, max_digits);
  //  ?[^\s\p{L}\p{N}]+[\r\n]* : symbols, led by at most one U+0020, then any line breaks.
  if (const size_t end = detail::symbols_end(text, pos, U"\r\n"); end != pos) return end;
  // What is left starts with whitespace.
  return detail::whitespace_end(text, pos);
}

}  // namespace deepspeed::examples

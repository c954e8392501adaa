// Hand-written matcher for GPT-2's split pattern; std::regex has no \p{} classes and would be
// ~100x slower. The alternatives are tried in the pattern's order, as a backtracking regex
// engine (Python `regex`, which GPT-2 used) tries them.
#include "pretokenizer.h"

#include "unicode_classes.h"

namespace deepspeed::examples {

using detail::char_class;
using detail::CharClass;
using detail::decode_utf8;

size_t gpt2_word_end(std::string_view text, size_t pos) {
  const size_t size = text.size();
  // 's|'t|'re|'ve|'m|'ll|'d : case-sensitive, so "I'M" splits as I ' M.
  if (text[pos] == '\'' && pos + 1 < size) {
    const char a = text[pos + 1];
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return pos + 2;
    if (pos + 2 < size) {
      const char b = text[pos + 2];
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) {
        return pos + 3;
      }
    }
  }

  char32_t cp;
  size_t len = decode_utf8(text, pos, &cp);
  CharClass cls = char_class(cp);
  size_t run_start = pos;
  // ` ?X+` for X in {L, N, other}: only U+0020 may lead, and only when a non-space follows.
  if (cp == U' ' && pos + 1 < size) {
    char32_t next;
    const size_t next_len = decode_utf8(text, pos + 1, &next);
    const CharClass next_cls = char_class(next);
    if (next_cls != CharClass::kSpace) {
      run_start = pos + 1;
      len = next_len;
      cls = next_cls;
    }
  }
  if (cls != CharClass::kSpace) {
    size_t end = run_start + len;
    while (end < size) {
      const size_t n = decode_utf8(text, end, &cp);
      if (char_class(cp) != cls) break;
      end += n;
    }
    return end;
  }

  // \s+(?!\S) then \s+ : a whitespace run that is followed by a non-space gives up its last
  // code point, which then leads the next word (" word"); a single one stands alone.
  size_t end = pos;
  size_t last_start = pos;
  while (end < size) {
    const size_t n = decode_utf8(text, end, &cp);
    if (char_class(cp) != CharClass::kSpace) break;
    last_start = end;
    end += n;
  }
  if (end == size) return end;
  return last_start > pos ? last_start : end;
}

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  std::vector<std::string_view> words;
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = gpt2_word_end(text, pos);
    words.push_back(text.substr(pos, end - pos));
    pos = end;
  }
  return words;
}

}  // namespace deepspeed::examples

// Hand-written matcher for GPT-4o's (o200k) split pattern and Mistral's Tekken variant (see
// pretokenizer.h), in the manner of llama3_word_end: the alternatives in the pattern's order,
// each as a backtracking regex engine (Oniguruma, which Hugging Face tokenizers runs it on)
// resolves it.
#include "pretokenizer.h"

#include "pattern_pieces.h"

namespace deepspeed::examples {

using detail::char_class;
using detail::CharClass;
using detail::decode_utf8;
using detail::letter_case;
using detail::LetterCase;

namespace {

constexpr size_t kNoMatch = std::string_view::npos;

// The end of the run of code points in the upper class U (or, with `lower`, in L) from pos.
size_t case_run_end(std::string_view text, size_t pos, bool lower, size_t* last_caseless) {
  char32_t cp;
  while (pos < text.size()) {
    const size_t n = decode_utf8(text, pos, &cp);
    const LetterCase c = letter_case(cp);
    if (!(lower ? detail::in_lower_class(c) : detail::in_upper_class(c))) break;
    if (c == LetterCase::kCaseless && last_caseless != nullptr) *last_caseless = pos;
    pos += n;
  }
  return pos;
}

bool lower_class_at(std::string_view text, size_t pos) {
  if (pos >= text.size()) return false;
  char32_t cp;
  decode_utf8(text, pos, &cp);
  return detail::in_lower_class(letter_case(cp));
}

// U*L+ at pos. U* takes the longest run of U, then gives code points back until L+ can start:
// where the run ends, if a code point of L follows; else at the run's last caseless code point
// (one in both classes), whose followers in the run are capitals that L+ cannot take.
size_t capitals_then_small(std::string_view text, size_t pos) {
  size_t last_caseless = kNoMatch;
  const size_t capitals = case_run_end(text, pos, /*lower=*/false, &last_caseless);
  size_t start = capitals;
  if (!lower_class_at(text, capitals)) {
    if (last_caseless == kNoMatch) return kNoMatch;
    start = last_caseless;
  }
  return case_run_end(text, start, /*lower=*/true, nullptr);
}

// U+L* at pos: a capital run, at least one, and the small letters after it.
size_t capitals_at_least_one(std::string_view text, size_t pos) {
  const size_t capitals = case_run_end(text, pos, /*lower=*/false, nullptr);
  if (capitals == pos) return kNoMatch;
  return case_run_end(text, capitals, /*lower=*/true, nullptr);
}

}  // namespace

size_t o200k_word_end(std::string_view text, size_t pos, int max_digits, bool contractions) {
  char32_t cp;
  const size_t len = decode_utf8(text, pos, &cp);
  const CharClass cls = char_class(cp);
  // [^\r\n\p{L}\p{N}]?U*L+C? then [^\r\n\p{L}\p{N}]?U+L*C?: each with its leading code point
  // first (when it may lead), then without.
  const bool may_lead = cls != CharClass::kLetter && cls != CharClass::kNumber &&
                        !detail::is_line_break(cp);
  for (auto word : {capitals_then_small, capitals_at_least_one}) {
    size_t end = may_lead ? word(text, pos + len) : kNoMatch;
    if (end == kNoMatch) end = word(text, pos);
    if (end != kNoMatch) return contractions ? detail::contraction_end(text, end) : end;
  }
  // \p{N}{1,max_digits}
  if (cls == CharClass::kNumber) return detail::digits_end(text, pos, max_digits);
  //  ?[^\s\p{L}\p{N}]+[\r\n/]* : symbols, led by at most one U+0020, then line breaks and
  // slashes.
  if (const size_t end = detail::symbols_end(text, pos, U"\r\n/"); end != pos) return end;
  // What is left starts with whitespace.
  return detail::whitespace_end(text, pos);
}

}  // namespace deepspeed::examples

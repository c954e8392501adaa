// Range tables for \p{L}, \p{N}, \s, the letter cases, \p{P}, \p{S} and \p{M}, and their
// lookup; ASCII goes through a 128-entry table (the letter cases, punctuation and symbols through
// comparisons) so the common case is one load. See
// gen_unicode_tables.py for where the ranges come from.
#include "unicode_classes.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace deepspeed::examples::detail {
namespace {

struct CodePointRange {
  char32_t lo;
  char32_t hi;
};

#include "unicode_class_tables.inc"

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t cp) {
  const auto* it = std::upper_bound(std::begin(ranges), std::end(ranges), cp,
                                    [](char32_t v, const CodePointRange& r) { return v < r.lo; });
  return it != std::begin(ranges) && cp <= std::prev(it)->hi;
}

CharClass classify_slow(char32_t cp) {
  if (cp == kInvalidCodePoint) return CharClass::kOther;
  if (in_ranges(kLetterRanges, cp)) return CharClass::kLetter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::kNumber;
  if (in_ranges(kSpaceRanges, cp)) return CharClass::kSpace;
  return CharClass::kOther;
}

const std::array<CharClass, 128>& ascii_table() {
  static const std::array<CharClass, 128> table = [] {
    std::array<CharClass, 128> t{};
    for (char32_t c = 0; c < 128; ++c) t[c] = classify_slow(c);
    return t;
  }();
  return table;
}

LetterCase letter_case_slow(char32_t cp) {
  if (cp == kInvalidCodePoint) return LetterCase::kNone;
  if (in_ranges(kUpperRanges, cp)) return LetterCase::kUpper;
  if (in_ranges(kLowerRanges, cp)) return LetterCase::kLower;
  if (in_ranges(kCaselessRanges, cp)) return LetterCase::kCaseless;
  return LetterCase::kNone;
}

}  // namespace

bool is_punctuation_or_symbol(char32_t cp) {
  // ASCII: every printable character but the space, the digits and the letters.
  if (cp < 128) {
    return cp > 32 && cp < 127 && !(cp >= '0' && cp <= '9') &&
           !((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z');
  }
  return cp != kInvalidCodePoint &&
         (in_ranges(kPunctuationRanges, cp) || in_ranges(kSymbolRanges, cp));
}

bool is_mark(char32_t cp) {
  return cp >= 128 && cp != kInvalidCodePoint && in_ranges(kMarkRanges, cp);
}

LetterCase letter_case(char32_t cp) {
  if (cp < 128) {
    if (cp >= 'A' && cp <= 'Z') return LetterCase::kUpper;
    if (cp >= 'a' && cp <= 'z') return LetterCase::kLower;
    return LetterCase::kNone;
  }
  return letter_case_slow(cp);
}

CharClass char_class(char32_t cp) {
  if (cp < 128) return ascii_table()[cp];
  return classify_slow(cp);
}

size_t decode_utf8(std::string_view text, size_t pos, char32_t* cp) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  char32_t value, min_value;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, value = b0 & 0x1F, min_value = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, value = b0 & 0x0F, min_value = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, value = b0 & 0x07, min_value = 0x10000;
  } else {
    *cp = kInvalidCodePoint;
    return 1;
  }
  if (pos + len > text.size()) {
    *cp = kInvalidCodePoint;
    return 1;
  }
  for (size_t i = 1; i < len; ++i) {
    const uint8_t b = byte(pos + i);
    if ((b & 0xC0) != 0x80) {
      *cp = kInvalidCodePoint;
      return 1;
    }
    value = (value << 6) | (b & 0x3F);
  }
  if (value < min_value || value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF)) {
    *cp = kInvalidCodePoint;
    return 1;
  }
  *cp = value;
  return len;
}

}  // namespace deepspeed::examples::detail

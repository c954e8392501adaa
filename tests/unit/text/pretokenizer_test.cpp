// GPT-2's and Llama 3's split patterns, rule by rule (the golden file in bpe_tokenizer_test and
// llama_tokenizer_parity_test against Hugging Face tokenizers cover the rest).
#include "pretokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "unicode_classes.h"

namespace deepspeed::examples {
namespace {

std::vector<std::string> split(std::string_view text) {
  std::vector<std::string> out;
  for (auto w : gpt2_pretokenize(text)) out.emplace_back(w);
  return out;
}
using Words = std::vector<std::string>;

TEST(Pretokenizer, LettersTakeOneLeadingSpace) {
  EXPECT_EQ(split("Hello world"), (Words{"Hello", " world"}));
  EXPECT_EQ(split("café au lait"), (Words{"café", " au", " lait"}));
}

TEST(Pretokenizer, Contractions) {
  EXPECT_EQ(split("don't we're I'm they'll"),
            (Words{"don", "'t", " we", "'re", " I", "'m", " they", "'ll"}));
  EXPECT_EQ(split("I'M"), (Words{"I", "'", "M"}));  // case-sensitive
  EXPECT_EQ(split("'sa"), (Words{"'s", "a"}));      // no word boundary needed
  EXPECT_EQ(split("!'s"), (Words{"!'", "s"}));      // punctuation run swallows the quote
}

TEST(Pretokenizer, NumbersAndPunctuation) {
  EXPECT_EQ(split("x2y 1234 3.5"), (Words{"x", "2", "y", " 1234", " 3", ".", "5"}));
  EXPECT_EQ(split("Hi!!! ...?"), (Words{"Hi", "!!!", " ...?"}));
}

TEST(Pretokenizer, WhitespaceRunsLeaveTheLastSpaceToTheNextWord) {
  EXPECT_EQ(split("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split("a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a \n b"), (Words{"a", " \n", " b"}));
  EXPECT_EQ(split("end   "), (Words{"end", "   "}));
  EXPECT_EQ(split("\n\n"), (Words{"\n\n"}));
  EXPECT_EQ(split("\t\tx"), (Words{"\t", "\t", "x"}));
}

TEST(Pretokenizer, AsciiClassesAreExact) {
  using detail::CharClass;
  for (char32_t c = 0; c < 128; ++c) {
    CharClass want = CharClass::kOther;
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) want = CharClass::kLetter;
    if (c >= '0' && c <= '9') want = CharClass::kNumber;
    if (c == ' ' || (c >= 9 && c <= 13)) want = CharClass::kSpace;  // not 0x1C..0x1F
    EXPECT_EQ(detail::char_class(c), want) << "code point " << static_cast<int>(c);
  }
}

TEST(Pretokenizer, InvalidUtf8IsSplitAndKeptByteForByte) {
  const std::string text = "ab\xFF\xC3 x\xE2\x82";  // stray byte, truncated sequences
  std::string joined;
  for (const auto& w : split(text)) joined += w;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(split("ab\xFF\xFE"), (Words{"ab", "\xFF\xFE"}));
}

std::vector<std::string> split_llama3(std::string_view text, int max_digits = 3) {
  std::vector<std::string> out;
  for (size_t p = 0; p < text.size();) {
    const size_t e = llama3_word_end(text, p, max_digits);
    out.emplace_back(text.substr(p, e - p));
    p = e;
  }
  return out;
}

TEST(Llama3Pretokenizer, ContractionsInAnyCaseAndOneLeaderBeforeLetters) {
  EXPECT_EQ(split_llama3("I'M don'T we'Re"), (Words{"I", "'M", " don", "'T", " we", "'Re"}));
  EXPECT_EQ(split_llama3("(hello) 'quoted"), (Words{"(hello", ")", " '", "quoted"}));
  EXPECT_EQ(split_llama3("\thello\nworld"), (Words{"\thello", "\n", "world"}));
}

TEST(Llama3Pretokenizer, NumbersInGroupsOfThree) {
  EXPECT_EQ(split_llama3("x 1234567 y"), (Words{"x", " ", "123", "456", "7", " y"}));
  EXPECT_EQ(split_llama3("1234", 1), (Words{"1", "2", "3", "4"}));  // Qwen2's variant
}

TEST(Llama3Pretokenizer, LineBreaksCloseSymbolsAndWhitespace) {
  EXPECT_EQ(split_llama3("end.\n\nNext"), (Words{"end", ".\n\n", "Next"}));
  EXPECT_EQ(split_llama3("a  \n\n  b"), (Words{"a", "  \n\n", " ", " b"}));
  EXPECT_EQ(split_llama3("a  b"), (Words{"a", " ", " b"}));
  EXPECT_EQ(split_llama3("end   "), (Words{"end", "   "}));
}

std::vector<std::string> split_o200k(std::string_view text, bool tekken = false) {
  std::vector<std::string> out;
  for (size_t p = 0; p < text.size();) {
    const size_t e = tekken ? o200k_word_end(text, p, 1, false) : o200k_word_end(text, p);
    out.emplace_back(text.substr(p, e - p));
    p = e;
  }
  return out;
}

// Expected words as Python's `regex` module splits with the pattern.
TEST(O200kPretokenizer, WordsEndWhereSmallLettersMeetACapital) {
  EXPECT_EQ(split_o200k("helloWorld HTTPServer"), (Words{"hello", "World", " HTTPServer"}));
  // Title case (U+01C5), a modifier letter (U+02B0) and an accented capital run (E-acute).
  EXPECT_EQ(split_o200k("\xC7\x85" "emal \xCA\xB0" "a \xC3\x89" "COLEs"),
            (Words{"\xC7\x85" "emal", " \xCA\xB0" "a", " \xC3\x89" "COLEs"}));
}

TEST(O200kPretokenizer, CaselessLettersAndMarksBelongToBothRuns) {
  // Han letters then a capital: the capital run gives back to the last caseless letter.
  EXPECT_EQ(split_o200k("\xE6\x97\xA5\xE6\x9C\xAC" "A"),
            (Words{"\xE6\x97\xA5\xE6\x9C\xAC", "A"}));
  // A combining mark before a capital is a word of its own (the first alternative, unled).
  EXPECT_EQ(split_o200k("\xCC\x81" "A"), (Words{"\xCC\x81", "A"}));
}

TEST(O200kPretokenizer, ContractionsStayOnTheirWord) {
  EXPECT_EQ(split_o200k("I'M don'T we'Re"), (Words{"I'M", " don'T", " we'Re"}));
  // Mistral's Tekken: no contractions, single digits.
  EXPECT_EQ(split_o200k("I'M don'T", true), (Words{"I", "'M", " don", "'T"}));
  EXPECT_EQ(split_o200k("x 1234", true), (Words{"x", " ", "1", "2", "3", "4"}));
}

TEST(O200kPretokenizer, SymbolRunsTakeLineBreaksAndSlashes) {
  EXPECT_EQ(split_o200k("a/b//\n/c"), (Words{"a", "/b", "//\n/", "c"}));
  EXPECT_EQ(split_o200k("x 1234567"), (Words{"x", " ", "123", "456", "7"}));
  EXPECT_EQ(split_o200k("end.\n\nNext"), (Words{"end", ".\n\n", "Next"}));
}

}  // namespace
}  // namespace deepspeed::examples

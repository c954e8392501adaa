// Shell quoting and splitting: see shell_words.h.
#include "shell_words.h"

#include <cctype>
#include <cstring>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

bool is_safe(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_@%+=:,./-", c) != nullptr;
}

bool is_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

}  // namespace

std::string shell_quote(const std::string& word) {
  if (word.empty()) return "''";
  bool safe = true;
  for (char c : word) safe = safe && is_safe(c);
  if (safe) return word;
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\"'\"'";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string shell_join(const std::vector<std::string>& words) {
  std::string out;
  for (const std::string& w : words) {
    if (!out.empty()) out += ' ';
    out += shell_quote(w);
  }
  return out;
}

std::vector<std::string> split_shell_words(const std::string& text, const std::string& flag) {
  std::vector<std::string> words;
  std::string word;
  bool in_word = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (is_blank(c)) {
      if (in_word) words.push_back(word);
      word.clear();
      in_word = false;
      continue;
    }
    in_word = true;
    if (c == '\\') {
      if (i + 1 >= text.size()) throw UsageError(flag + " '" + text + "': ends with a lone backslash");
      word += text[++i];
    } else if (c == '\'') {
      std::size_t end = text.find('\'', i + 1);
      if (end == std::string::npos) throw UsageError(flag + " '" + text + "': unterminated single quote");
      word += text.substr(i + 1, end - i - 1);
      i = end;
    } else if (c == '"') {
      std::size_t j = i + 1;
      for (; j < text.size() && text[j] != '"'; ++j) {
        if (text[j] == '\\' && j + 1 < text.size() && std::strchr("\\\"$`\n", text[j + 1]) != nullptr) ++j;
        word += text[j];
      }
      if (j >= text.size()) throw UsageError(flag + " '" + text + "': unterminated double quote");
      i = j;
    } else {
      word += c;
    }
  }
  if (in_word) words.push_back(word);
  return words;
}

}  // namespace deepspeed::launcher

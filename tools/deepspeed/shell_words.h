// Shell words: quoting a word for a remote POSIX shell (the command ssh runs on each host) and
// splitting --launcher_args the way DeepSpeed does (Python's shlex.split, POSIX mode). Pure.
#pragma once

#include <string>
#include <vector>

namespace deepspeed::launcher {

// `word` as one POSIX shell word: unchanged when it has only safe characters
// ([A-Za-z0-9_@%+=:,./-], as shlex.quote), else in single quotes with ' written as '"'"'.
std::string shell_quote(const std::string& word);

// Each word quoted, joined by spaces.
std::string shell_join(const std::vector<std::string>& words);

// Splits like shlex.split: blanks separate words; '...' is literal; "..." keeps blanks and takes
// \ only before \ " $ ` and newline; a bare \ escapes the next character. Throws UsageError naming
// `flag` for an unterminated quote or a trailing backslash.
std::vector<std::string> split_shell_words(const std::string& text, const std::string& flag);

}  // namespace deepspeed::launcher

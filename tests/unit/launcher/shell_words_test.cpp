// Tests for shell quoting and --launcher_args splitting (tools/deepspeed/shell_words.cpp): the
// quoted word must survive a real /bin/sh, and the split must match Python's shlex.split.
#include "shell_words.h"

#include <gtest/gtest.h>

#include <cstdio>

#include "expect_usage.h"

namespace deepspeed::launcher {
namespace {

using testing::expect_usage_error;
using Words = std::vector<std::string>;

std::string run_sh(const std::string& script) {
  std::string out;
  FILE* pipe = ::popen(("/bin/sh -c " + shell_quote(script)).c_str(), "r");
  char buffer[256];
  while (pipe != nullptr && std::fgets(buffer, sizeof(buffer), pipe) != nullptr) out += buffer;
  if (pipe != nullptr) ::pclose(pipe);
  return out;
}

TEST(ShellQuote, SafeWordsStayBare) {
  EXPECT_EQ(shell_quote("--world_info=eyJh-_0="), "--world_info=eyJh-_0=");
  EXPECT_EQ(shell_quote("/usr/bin/prog"), "/usr/bin/prog");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("it's"), "'it'\"'\"'s'");
}

TEST(ShellQuote, SurvivesARealShell) {
  const Words words = {"plain", "two words", "it's", "$HOME", "`date`", "a\"b", "back\\slash", "*", "semi;colon", ""};
  std::string script = "for w in " + shell_join(words) + "; do printf '[%s]\\n' \"$w\"; done";
  std::string expected;
  for (const std::string& w : words) expected += "[" + w + "]\n";
  EXPECT_EQ(run_sh(script), expected);
}

TEST(SplitShellWords, MatchesShlexSplit) {
  EXPECT_EQ(split_shell_words("", "--launcher_args"), Words{});
  EXPECT_EQ(split_shell_words("  -x FOO=1   --mca btl tcp ", "f"), (Words{"-x", "FOO=1", "--mca", "btl", "tcp"}));
  EXPECT_EQ(split_shell_words("--mca plm_rsh_args '-F /tmp/ssh config'", "f"),
            (Words{"--mca", "plm_rsh_args", "-F /tmp/ssh config"}));
  EXPECT_EQ(split_shell_words(R"(-o "ProxyCommand=ssh -W %h:%p \"gw\"" a\ b x''y)", "f"),
            (Words{"-o", "ProxyCommand=ssh -W %h:%p \"gw\"", "a b", "xy"}));
  EXPECT_EQ(split_shell_words(R"("a\nb" 'c\d')", "f"), (Words{"a\\nb", "c\\d"}));
}

TEST(SplitShellWords, UnterminatedQuote_NamesTheFlag) {
  expect_usage_error([] { split_shell_words("-o 'abc", "--launcher_args"); }, {"--launcher_args '-o 'abc'", "unterminated single quote"});
  expect_usage_error([] { split_shell_words("\"abc", "--launcher_args"); }, {"unterminated double quote"});
  expect_usage_error([] { split_shell_words("abc\\", "--launcher_args"); }, {"lone backslash"});
}

}  // namespace
}  // namespace deepspeed::launcher

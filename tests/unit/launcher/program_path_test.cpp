// Tests for resolve_program() (tools/deepspeed/program_path.cpp): PATH lookup and the errors a
// wrong PROGRAM gets before any rank starts.
#include "program_path.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

std::string error_of(const std::string& program, const std::string& path_env) {
  try {
    resolve_program(program, path_env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ProgramPath, PathsAreCheckedAndKept) {
  EXPECT_EQ(resolve_program("/bin/sh", ""), "/bin/sh");
  EXPECT_NE(error_of("/nonexistent/train_gpt", "").find("'/nonexistent/train_gpt'"), std::string::npos);
  EXPECT_NE(error_of("/tmp", "").find("is a directory"), std::string::npos);
}

TEST(ProgramPath, BareNames_AreLookedUpOnPath) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin"), "/bin/sh");
  std::string message = error_of("no_such_program_xyz", "/bin:/usr/bin");
  EXPECT_NE(message.find("'no_such_program_xyz' was not found on PATH"), std::string::npos) << message;
}

TEST(ProgramPath, NonExecutableScript_GetsPythonHint) {
  const std::string script = ::testing::TempDir() + "/ds_launcher_train.py";
  std::ofstream(script) << "print('hi')\n";
  ::chmod(script.c_str(), 0644);
  std::string message = error_of(script, "");
  EXPECT_NE(message.find("is not executable"), std::string::npos) << message;
  EXPECT_NE(message.find("python3 " + script), std::string::npos) << message;
  std::remove(script.c_str());
}

}  // namespace
}  // namespace deepspeed::launcher

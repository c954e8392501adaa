// PROGRAM lookup: see program_path.h.
#include "program_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

bool is_executable_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string python_hint(const std::string& program) {
  if (!ends_with(program, ".py")) return "";
  return "; deepspeed-cpp runs PROGRAM as an executable, so start a Python script with "
         "`deepspeed [OPTIONS] python3 " + program + " ARGS...`";
}

}  // namespace

std::string resolve_program(const std::string& program, const std::string& path_env) {
  if (program.empty()) throw UsageError("PROGRAM is empty; usage: deepspeed [OPTIONS] PROGRAM [ARGS...]");
  if (program.find('/') != std::string::npos) {
    struct stat st{};
    if (::stat(program.c_str(), &st) != 0) {
      throw UsageError("PROGRAM '" + program + "': " + std::strerror(errno) + python_hint(program));
    }
    if (S_ISDIR(st.st_mode)) throw UsageError("PROGRAM '" + program + "' is a directory, not an executable");
    if (!S_ISREG(st.st_mode) || ::access(program.c_str(), X_OK) != 0) {
      throw UsageError("PROGRAM '" + program + "' is not executable (chmod +x it, or run it through " +
                       "its interpreter)" + python_hint(program));
    }
    return program;
  }
  std::size_t start = 0;
  while (start <= path_env.size()) {
    std::size_t colon = path_env.find(':', start);
    std::string dir = path_env.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";  // an empty PATH entry means the current directory, as for execvp
    std::string candidate = dir + "/" + program;
    if (is_executable_file(candidate)) return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  throw UsageError("PROGRAM '" + program + "' was not found on PATH and is not a path (give ./" +
                   program + " or an absolute path for a file in the current directory)" +
                   python_hint(program));
}

}  // namespace deepspeed::launcher

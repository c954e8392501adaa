// run_command() implementation over std::system with redirections to a TempDir.
#include "support/run_command.h"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "support/temp_dir.h"

namespace deepspeed::testing {

CommandResult run_command(const std::string& command) {
  TempDir dir("ds_cmd");
  std::string full = "(" + command + ") >" + dir.file("out") + " 2>" + dir.file("err") + " </dev/null";
  int status = std::system(full.c_str());
  CommandResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto slurp = [](const std::string& p) {
    std::ifstream in(p);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  r.out = slurp(dir.file("out"));
  r.err = slurp(dir.file("err"));
  return r;
}

}  // namespace deepspeed::testing

// --save_pid file: see pid_file.h.
#include "pid_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace deepspeed::launcher {

PidFile::PidFile(bool enabled, const std::string& directory) {
  if (!enabled) return;
  std::string pid = std::to_string(::getpid());
  std::string path = directory + "/" + pid + ".deepspeed";
  std::ofstream out(path, std::ios::trunc);
  out << pid;
  out.close();
  if (!out) {
    throw std::runtime_error("--save_pid: cannot write " + path + ": " + std::strerror(errno));
  }
  path_ = path;
}

PidFile::~PidFile() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

}  // namespace deepspeed::launcher

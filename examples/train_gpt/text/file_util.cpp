// Whole-file reads and atomic writes (temp file in the same directory, fsync, rename(2)).
// POSIX only: rename within one directory is atomic there, which is the whole point.
#include "file_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace deepspeed::examples {
namespace {

std::runtime_error os_error(const std::string& what, const std::string& path) {
  return std::runtime_error(what + " " + path + ": " + std::strerror(errno));
}

}  // namespace

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw os_error("cannot open", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw os_error("error reading", path);
  return std::move(buffer).str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  // pid + per-process counter keeps concurrent writers (ranks, threads) off each other's temp.
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw os_error("cannot create", tmp);
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const auto err = os_error("cannot write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      throw err;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  // fsync before rename: otherwise a crash can leave the new name pointing at empty blocks.
  const bool synced = ::fsync(fd) == 0;
  const int sync_errno = errno;
  if (::close(fd) != 0 || !synced) {
    if (!synced) errno = sync_errno;
    const auto err = os_error("cannot flush", tmp);
    ::unlink(tmp.c_str());
    throw err;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const auto err = os_error("cannot rename " + tmp + " to", path);
    ::unlink(tmp.c_str());
    throw err;
  }
}

}  // namespace deepspeed::examples

// SwapFolderLock: flock() on a lock file in the swap folder (see swap_folder_lock.h).
#include "runtime/swap/swap_folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "deepspeed/aio.h"
#include "util/check.h"

namespace deepspeed::runtime::swap {
namespace {

constexpr const char* kLockFileName = "deepspeed_swap.lock";

// What the holder wrote into the lock file: "pid P on host H".
std::string read_holder(int fd) {
  char text[256] = {};
  const ssize_t n = ::pread(fd, text, sizeof(text) - 1, 0);
  std::string holder = n > 0 ? std::string(text, static_cast<size_t>(n)) : std::string();
  while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' ')) holder.pop_back();
  return holder.empty() ? "pid unknown" : holder;
}

std::string this_holder() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "?");
  return "pid " + std::to_string(::getpid()) + " on host " + host;
}

bool same_file(int fd, const std::string& path) {
  struct stat by_fd {};
  struct stat by_path {};
  return ::fstat(fd, &by_fd) == 0 && ::stat(path.c_str(), &by_path) == 0 &&
         by_fd.st_dev == by_path.st_dev && by_fd.st_ino == by_path.st_ino;
}

}  // namespace

SwapFolderLock::SwapFolderLock(const std::string& folder, const std::string& config_key,
                               const std::string& nvme_path)
    : path_(folder + "/" + kLockFileName) {
  // A holder that ends removes the file: one that opened it just before may then lock a file
  // no longer at the path. Such a lock protects nothing, so it is dropped and taken again.
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      throw aio::AioError("cannot create the swap lock file " + path_ + ": " +
                          std::strerror(errno) + " (" + config_key + " is " + nvme_path + ")");
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const std::string holder = read_holder(fd);
      ::close(fd);
      if (err != EWOULDBLOCK) {
        throw aio::AioError("cannot lock the swap lock file " + path_ + ": " +
                            std::strerror(err) + " (" + config_key + " is " + nvme_path + ")");
      }
      const bool this_process = holder.rfind("pid " + std::to_string(::getpid()) + " ", 0) == 0;
      throw ConfigError(config_key + ": nvme_path " + nvme_path + " is in use by " +
                        (this_process ? "another engine of this process" : "another job") +
                        " (" + holder + ", lock file " + path_ +
                        "); jobs sharing a swap folder would overwrite each other's swap files. "
                        "Give each job its own nvme_path, or wait until that job has ended");
    }
    if (!same_file(fd, path_)) {
      ::close(fd);
      continue;
    }
    const std::string holder = this_holder() + "\n";
    if (::ftruncate(fd, 0) != 0 ||
        ::pwrite(fd, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size())) {
      const int err = errno;
      ::close(fd);
      throw aio::AioError("cannot write the swap lock file " + path_ + ": " +
                          std::strerror(err) + " (" + config_key + " is " + nvme_path + ")");
    }
    fd_ = fd;
    return;
  }
  DS_INTERNAL_ASSERT(false, "could not lock ", path_, " in 100 attempts");
}

SwapFolderLock::~SwapFolderLock() {
  if (fd_ < 0) return;
  ::unlink(path_.c_str());  // while locked: see the constructor
  ::close(fd_);
}

}  // namespace deepspeed::runtime::swap

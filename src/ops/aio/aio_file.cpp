// Swap-file opening for the AIO engine (see aio_file.h).
#include "ops/aio/aio_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "deepspeed/aio.h"

namespace deepspeed::aio::detail {

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

FileDescriptor::~FileDescriptor() { close(); }

FileDescriptor::FileDescriptor(FileDescriptor&& other) noexcept
    : fd_(other.fd_), direct_(other.direct_) {
  other.fd_ = -1;
}

FileDescriptor& FileDescriptor::operator=(FileDescriptor&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = other.fd_;
    direct_ = other.direct_;
    other.fd_ = -1;
  }
  return *this;
}

int FileDescriptor::close() {
  if (fd_ < 0) return 0;
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc == 0 ? 0 : errno;
}

namespace {

// Where the usual causes of a failed open are not obvious from the errno text alone.
std::string hint(int err, bool write) {
  switch (err) {
    case ENOENT:
      return write ? "; does its directory exist?" : "; was it written by this job (swap out before swap in)?";
    case EACCES:
    case EPERM:
      return write ? "; is the directory writable by this user?" : "; is it readable by this user?";
    case EROFS:
      return "; point nvme_path at a writable filesystem";
    case ENOSPC:
      return "; free space on the device or choose another nvme_path";
    default:
      return "";
  }
}

int open_retrying(const char* path, int flags, mode_t mode) {
  int fd;
  do {
    fd = ::open(path, flags, mode);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

FileDescriptor open_maybe_direct(const std::string& path, int flags, bool want_direct,
                                 bool write) {
  if (want_direct) {
    const int fd = open_retrying(path.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0) return FileDescriptor(fd, /*direct=*/true);
    // EINVAL: the filesystem has no O_DIRECT (older tmpfs, some FUSE and network
    // filesystems); the same file opened buffered works, only through the page cache.
    if (errno != EINVAL) {
      const int err = errno;
      throw AioError("aio: cannot open " + path + (write ? " for writing: " : " for reading: ") +
                     errno_text(err) + hint(err, write));
    }
  }
  const int fd = open_retrying(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int err = errno;
    throw AioError("aio: cannot open " + path + (write ? " for writing: " : " for reading: ") +
                   errno_text(err) + hint(err, write));
  }
  return FileDescriptor(fd, /*direct=*/false);
}

}  // namespace

FileDescriptor open_for_write(const std::string& path, bool want_direct) {
  return open_maybe_direct(path, O_WRONLY | O_CREAT | O_CLOEXEC, want_direct, /*write=*/true);
}

FileDescriptor open_for_read(const std::string& path, int64_t expected_bytes, bool want_direct) {
  FileDescriptor fd = open_maybe_direct(path, O_RDONLY | O_CLOEXEC, want_direct, /*write=*/false);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    throw AioError("aio: cannot stat " + path + ": " + errno_text(err));
  }
  if (static_cast<int64_t>(st.st_size) != expected_bytes) {
    throw AioError("aio: " + path + " holds " + std::to_string(st.st_size) +
                   " bytes but the buffer to read it into has " +
                   std::to_string(expected_bytes) +
                   " (buffer nbytes != file bytes: a truncated file, or one written by a run "
                   "with other sizes)");
  }
  return fd;
}

}  // namespace deepspeed::aio::detail

// AtomicFile and the directory helpers: see Note [Atomic checkpoint files].
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "deepspeed/checkpoint.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

std::string errno_text() { return std::strerror(errno); }

std::string parent_directory(const std::string& path) {
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string base_name(const std::string& path) {
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  DS_CHECK(!path_.empty() && path_.back() != '/', CheckpointError, "'", path_,
           "' is not a file path");
  static std::atomic<int> counter{0};
  const std::string dir = parent_directory(path_);
  for (int attempt = 0; fd_ < 0; ++attempt) {
    temp_path_ = dir + "/." + base_name(path_) + ".tmp." + std::to_string(::getpid()) + "." +
                 std::to_string(counter++);
    // O_EXCL: never reuse a stale temporary of a crashed writer with the same pid.
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    DS_CHECK(fd_ >= 0 || (errno == EEXIST && attempt < 100), CheckpointError,
             "cannot create a file in ", dir, " (to write ", path_, "): ", errno_text());
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::write(const void* data, size_t size) {
  DS_CHECK(fd_ >= 0, CheckpointError, path_, ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0 && errno == EINTR) continue;
    DS_CHECK(n > 0, CheckpointError, path_, ": write failed after ", bytes_written_,
             " bytes: ", n < 0 ? errno_text() : "no progress",
             " (the previous file, if any, is untouched)");
    p += n;
    size -= static_cast<size_t>(n);
    bytes_written_ += n;
  }
}

void AtomicFile::write_at(const void* data, size_t size, int64_t offset) {
  DS_CHECK(fd_ >= 0, CheckpointError, path_, ": write after commit");
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    DS_CHECK(n > 0, CheckpointError, path_, ": write failed at offset ", offset, ": ",
             n < 0 ? errno_text() : "no progress", " (the previous file, if any, is untouched)");
    p += n;
    size -= static_cast<size_t>(n);
    offset += n;
    bytes_written_ += n;
  }
}

bool AtomicFile::set_direct_io(bool on) {
  DS_CHECK(fd_ >= 0, CheckpointError, path_, ": O_DIRECT after commit");
  const int flags = ::fcntl(fd_, F_GETFL);
  DS_CHECK(flags >= 0, CheckpointError, path_, ": fcntl(F_GETFL) failed: ", errno_text());
  const int wanted = on ? (flags | O_DIRECT) : (flags & ~O_DIRECT);
  if (wanted == flags) return true;
  // Linux refuses O_DIRECT here (EINVAL) on file systems without direct I/O, e.g. older tmpfs.
  return ::fcntl(fd_, F_SETFL, wanted) == 0;
}

void AtomicFile::commit() {
  DS_CHECK(fd_ >= 0, CheckpointError, path_, ": committed twice");
  DS_CHECK(::fsync(fd_) == 0, CheckpointError, path_, ": fsync failed: ", errno_text());
  const int rc = ::close(fd_);
  fd_ = -1;
  DS_CHECK(rc == 0, CheckpointError, path_, ": close failed: ", errno_text());
  DS_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, CheckpointError, "renaming ",
           temp_path_, " to ", path_, " failed: ", errno_text());
  committed_ = true;
  fsync_directory(parent_directory(path_));
}

void write_file_atomically(const std::string& path, const std::string& content) {
  AtomicFile file(path);
  file.write(content.data(), content.size());
  file.commit();
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DS_CHECK(fd >= 0, CheckpointError, dir, ": cannot open directory to fsync it: ", errno_text());
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); their renames are durable anyway.
  DS_CHECK(rc == 0 || saved == EINVAL, CheckpointError, dir, ": fsync failed: ",
           std::strerror(saved));
}

void create_directories(const std::string& dir) {
  DS_CHECK(!dir.empty(), CheckpointError, "empty checkpoint directory path");
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string part = dir.substr(0, pos);
    if (part.empty()) continue;
    if (::mkdir(part.c_str(), 0777) == 0) continue;
    const int err = errno;
    struct stat st {};
    DS_CHECK(err == EEXIST && ::stat(part.c_str(), &st) == 0 && S_ISDIR(st.st_mode),
             CheckpointError, "cannot create directory ", part, ": ",
             err == EEXIST ? "a file of that name exists" : std::strerror(err));
  }
}

}  // namespace deepspeed::checkpoint

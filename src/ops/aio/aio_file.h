// Opening swap files for the AIO engine: O_DIRECT where the filesystem allows it, a buffered
// descriptor where it does not, and errors that name the file and the errno text.
#pragma once

#include <cstdint>
#include <string>

namespace deepspeed::aio::detail {

/// "No such file or directory (errno 2)".
std::string errno_text(int err);

/// An open descriptor; closes itself.
class FileDescriptor {
 public:
  FileDescriptor() = default;
  FileDescriptor(int fd, bool direct) : fd_(fd), direct_(direct) {}
  ~FileDescriptor();
  FileDescriptor(FileDescriptor&& other) noexcept;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept;
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;

  int get() const { return fd_; }
  /// Opened with O_DIRECT: transfers must be aligned (see kDirectIoAlignment).
  bool direct() const { return direct_; }
  /// Closes now; returns 0 or the errno of close() (a deferred write error on some filesystems).
  int close();

 private:
  int fd_ = -1;
  bool direct_ = false;
};

/// Opens (creating if needed) `path` for writing. With `want_direct`, tries O_DIRECT first and
/// falls back to buffered I/O when the filesystem refuses it (EINVAL). The file is not
/// truncated here: the writer sets its final size once all blocks are written. Throws AioError
/// naming the file.
FileDescriptor open_for_write(const std::string& path, bool want_direct);

/// Opens `path` for reading and checks that it holds exactly `expected_bytes` bytes. Throws
/// AioError naming the file (missing, unreadable, or of another size).
FileDescriptor open_for_read(const std::string& path, int64_t expected_bytes, bool want_direct);

}  // namespace deepspeed::aio::detail

// PidFile: --save_pid. Writes the launcher's pid to /tmp/<pid>.deepspeed for the launcher's
// lifetime (DeepSpeed's launch.py writes the same file so job tools can find and signal it).
#pragma once

#include <string>

namespace deepspeed::launcher {

class PidFile {
 public:
  // Writes the file when `enabled`; throws std::runtime_error naming the path if it cannot.
  explicit PidFile(bool enabled, const std::string& directory = "/tmp");
  // Removes the file.
  ~PidFile();
  PidFile(const PidFile&) = delete;
  PidFile& operator=(const PidFile&) = delete;

  const std::string& path() const { return path_; }  // "" when disabled

 private:
  std::string path_;
};

}  // namespace deepspeed::launcher

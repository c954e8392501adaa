// TempDir: a fresh temporary directory, removed with its contents on destruction.
#pragma once

#include <string>

namespace deepspeed::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "ds_test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  /// path() + "/" + name
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Writes `text` to `path` (truncating).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace deepspeed::testing

// TempDir implementation (mkdtemp + recursive removal).
#include "support/temp_dir.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "util/remove_tree.h"

namespace deepspeed::testing {

TempDir::TempDir(const std::string& prefix) {
  std::string base = std::filesystem::temp_directory_path().string() + "/" + prefix + "_XXXXXX";
  std::vector<char> buf(base.begin(), base.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed for " + base);
  path_ = buf.data();
}

TempDir::~TempDir() { util::remove_tree(path_); }

void write_text_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

}  // namespace deepspeed::testing

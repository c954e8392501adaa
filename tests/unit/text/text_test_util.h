// Helpers shared by the torch-free text tests: fixture paths, a scratch directory, file I/O and
// an assertion on exception text. Kept here (not tests/support) so these tests link no LibTorch.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#ifndef DS_TEST_DATA_DIR
#error "DS_TEST_DATA_DIR must name tests/data"
#endif

namespace deepspeed::examples::testing {

inline std::string test_data_path(const std::string& name) {
  return std::string(DS_TEST_DATA_DIR) + "/" + name;
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << "cannot write " << path;
}

// A fresh directory under $TMPDIR (or /tmp), removed with its contents on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/ds_text_test.XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr)
      throw std::runtime_error("mkdtemp failed: " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace deepspeed::examples::testing

// Expects `expr` to throw a std::exception whose what() contains `needle`.
#define EXPECT_THROW_WITH(expr, needle)                                            \
  do {                                                                             \
    bool ds_threw_ = false;                                                        \
    try {                                                                          \
      (void)(expr);                                                                \
    } catch (const std::exception& ds_e_) {                                        \
      ds_threw_ = true;                                                            \
      EXPECT_NE(std::string(ds_e_.what()).find(needle), std::string::npos)         \
          << "message: " << ds_e_.what() << "\nexpected to contain: " << (needle); \
    }                                                                              \
    EXPECT_TRUE(ds_threw_) << #expr " did not throw";                              \
  } while (0)

// LinePrefixer: turns one rank's byte stream (arriving in arbitrary chunks from a pipe) into whole
// lines that start with "[rank R] ". Pure: no I/O, so chunk boundaries can be unit-tested.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace deepspeed::launcher {

class LinePrefixer {
 public:
  // A line longer than this is emitted in pieces of this size, each prefixed and ended with '\n':
  // a rank that writes megabytes without a newline (a progress bar using '\r') must not make the
  // launcher hold unbounded memory or hide the output until the rank exits.
  static constexpr std::size_t kDefaultMaxLineBytes = 64 * 1024;

  explicit LinePrefixer(std::string prefix, std::size_t max_line_bytes = kDefaultMaxLineBytes);

  // Consumes `data` and returns every line it completes, each as prefix + text + '\n' (empty if no
  // line was completed). A trailing partial line is kept until a later feed() or flush().
  std::string feed(std::string_view data);

  // Returns the pending partial line as prefix + text + '\n' (the newline the rank never wrote), or
  // "" when nothing is pending. Call when the stream ends or the rank exits.
  std::string flush();

  bool has_partial() const { return !partial_.empty(); }
  const std::string& prefix() const { return prefix_; }

 private:
  void append_line(std::string& out, std::string_view text) const;

  std::string prefix_;
  std::size_t max_line_bytes_;
  std::string partial_;  // bytes after the last '\n' seen, not yet emitted
};

// "[rank R] ": the prefix the launcher puts before every line of rank R.
std::string rank_prefix(int rank);

}  // namespace deepspeed::launcher

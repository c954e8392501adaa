// LinePrefixer: see line_prefixer.h.
#include "line_prefixer.h"

namespace deepspeed::launcher {

LinePrefixer::LinePrefixer(std::string prefix, std::size_t max_line_bytes)
    : prefix_(std::move(prefix)), max_line_bytes_(max_line_bytes == 0 ? 1 : max_line_bytes) {}

void LinePrefixer::append_line(std::string& out, std::string_view text) const {
  out += prefix_;
  out += text;
  out += '\n';
}

std::string LinePrefixer::feed(std::string_view data) {
  std::string out;
  while (!data.empty()) {
    std::size_t newline = data.find('\n');
    if (newline == std::string_view::npos) {
      partial_ += data;
      break;
    }
    if (partial_.empty()) {
      append_line(out, data.substr(0, newline));
    } else {
      partial_ += data.substr(0, newline);
      append_line(out, partial_);
      partial_.clear();
    }
    data.remove_prefix(newline + 1);
  }
  // Emit over-long pending text in max-sized pieces; the remainder stays pending.
  std::size_t emitted = 0;
  while (partial_.size() - emitted >= max_line_bytes_) {
    append_line(out, std::string_view(partial_).substr(emitted, max_line_bytes_));
    emitted += max_line_bytes_;
  }
  if (emitted > 0) partial_.erase(0, emitted);
  return out;
}

std::string LinePrefixer::flush() {
  if (partial_.empty()) return {};
  std::string out;
  append_line(out, partial_);
  partial_.clear();
  return out;
}

std::string rank_prefix(int rank) { return "[rank " + std::to_string(rank) + "] "; }

}  // namespace deepspeed::launcher

// Hostfile parsing: see hostfile.h.
#include "hostfile.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

constexpr const char* kSlotsKey = "slots=";

std::vector<std::string> whitespace_tokens(std::string_view line) {
  std::vector<std::string> tokens;
  std::istringstream in{std::string(line)};
  std::string token;
  while (in >> token) tokens.push_back(token);
  return tokens;
}

std::string where(const std::string& path, int line_number, std::string_view line) {
  return "hostfile " + path + " line " + std::to_string(line_number) + " '" + std::string(line) + "'";
}

}  // namespace

ResourcePool parse_hostfile(const std::string& text, const std::string& path) {
  ResourcePool pool;
  std::vector<std::string> lines = split(text, '\n');
  for (std::size_t i = 0; i < lines.size(); ++i) {
    const int line_number = static_cast<int>(i) + 1;
    std::string_view line = trim(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    std::vector<std::string> tokens = whitespace_tokens(line);
    if (tokens.size() < 2 || !starts_with(tokens[1], kSlotsKey)) {
      throw UsageError(where(path, line_number, line) +
                       ": expected '<host> slots=<count>', e.g. 'worker-0 slots=4' (lines starting "
                       "with # are comments)");
    }
    std::string count_text = tokens[1].substr(std::strlen(kSlotsKey));
    std::optional<int> slots = parse_decimal(count_text);
    if (!slots || *slots <= 0) {
      throw UsageError(where(path, line_number, line) + ": slots must be a positive integer, got '" +
                       count_text + "'");
    }
    for (const HostSlots& seen : pool) {
      if (seen.host == tokens[0]) {
        throw UsageError(where(path, line_number, line) + ": host '" + tokens[0] +
                         "' is listed twice (also on line " + std::to_string(seen.line) +
                         "); give each host one line with all its slots");
      }
    }
    pool.push_back(HostSlots{tokens[0], *slots, line_number});
  }
  if (pool.empty()) {
    throw UsageError("hostfile " + path + " lists no hosts: it is empty or only comments; expected "
                     "'<host> slots=<count>' lines (or leave out --hostfile to run on this machine)");
  }
  return pool;
}

std::optional<ResourcePool> read_hostfile(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return std::nullopt;
    throw UsageError("hostfile " + path + ": " + std::strerror(errno));
  }
  if (S_ISDIR(st.st_mode)) throw UsageError("hostfile " + path + " is a directory, not a file");
  std::ifstream in(path);
  if (!in) throw UsageError("hostfile " + path + ": cannot be read: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return parse_hostfile(text.str(), path);
}

int total_slots(const ResourcePool& pool) {
  int total = 0;
  for (const HostSlots& h : pool) total += h.slots;
  return total;
}

}  // namespace deepspeed::launcher

// Core list parsing and printing: see core_list.h.
#include "core_list.h"

#include <algorithm>
#include <cctype>

#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

int parse_core(std::string_view item, std::string_view whole, std::string_view flag) {
  bool digits = !item.empty() && item.size() <= 6 &&
                std::all_of(item.begin(), item.end(), [](unsigned char c) { return std::isdigit(c); });
  if (!digits) {
    throw UsageError(std::string(flag) + " '" + std::string(whole) + "': '" + std::string(item) +
                     "' is not a core number; expected a list like 0,2-5,7");
  }
  return std::stoi(std::string(item));
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

std::vector<int> parse_core_list(std::string_view text, std::string_view flag) {
  std::vector<int> cores;
  std::string_view rest = text;
  while (true) {
    std::size_t comma = rest.find(',');
    std::string_view item = trim(rest.substr(0, comma));
    std::size_t dash = item.find('-');
    int first = 0;
    int last = 0;
    if (dash == std::string_view::npos) {
      first = last = parse_core(item, text, flag);
    } else {
      first = parse_core(trim(item.substr(0, dash)), text, flag);
      last = parse_core(trim(item.substr(dash + 1)), text, flag);
      if (last < first) {
        throw UsageError(std::string(flag) + " '" + std::string(text) + "': range '" +
                         std::string(item) + "' runs backwards; write it as " +
                         std::to_string(last) + "-" + std::to_string(first));
      }
    }
    for (int core = first; core <= last; ++core) {
      if (std::find(cores.begin(), cores.end(), core) == cores.end()) cores.push_back(core);
    }
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  return cores;
}

std::string format_core_list(const std::vector<int>& cores) {
  std::string out;
  std::size_t i = 0;
  while (i < cores.size()) {
    std::size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cores[i]);
    if (j > i) out += "-" + std::to_string(cores[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace deepspeed::launcher

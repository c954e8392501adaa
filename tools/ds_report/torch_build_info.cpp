// show_config() parsing: see torch_build_info.h.
#include "torch_build_info.h"

#include <sstream>

namespace deepspeed::report {
namespace {

std::string trimmed(const std::string& s) {
  std::size_t first = s.find_first_not_of(" \t\r");
  if (first == std::string::npos) return "";
  return s.substr(first, s.find_last_not_of(" \t\r,") - first + 1);
}

// "  - CuDNN 8.5  (built against CUDA 11.7)" with prefix "CuDNN " -> "8.5".
bool take_version(const std::string& item, const std::string& prefix, std::string& out) {
  if (item.rfind(prefix, 0) != 0) return false;
  std::istringstream words(item.substr(prefix.size()));
  words >> out;
  return true;
}

}  // namespace

std::string TorchBuildInfo::setting(const std::string& key, const std::string& fallback) const {
  auto it = settings.find(key);
  return it == settings.end() ? fallback : it->second;
}

TorchBuildInfo parse_show_config(const std::string& text) {
  TorchBuildInfo info;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::string item = trimmed(line);
    if (item.rfind("- ", 0) != 0) continue;
    item = item.substr(2);
    if (take_version(item, "CUDA Runtime ", info.cuda_runtime)) continue;
    if (take_version(item, "CuDNN ", info.cudnn)) continue;
    if (item.rfind("CPU capability usage: ", 0) == 0) {
      info.cpu_capability = trimmed(item.substr(22));
      continue;
    }
    if (item.rfind("Build settings: ", 0) == 0) {
      // "KEY=value, KEY=value, ..."; CXX_FLAGS holds spaces but no ", ", so splitting there is safe.
      std::string rest = item.substr(16);
      std::size_t start = 0;
      while (start < rest.size()) {
        std::size_t end = rest.find(", ", start);
        std::string pair = rest.substr(start, end == std::string::npos ? std::string::npos : end - start);
        std::size_t eq = pair.find('=');
        if (eq != std::string::npos) info.settings[trimmed(pair.substr(0, eq))] = trimmed(pair.substr(eq + 1));
        if (end == std::string::npos) break;
        start = end + 2;
      }
    }
  }
  return info;
}

}  // namespace deepspeed::report

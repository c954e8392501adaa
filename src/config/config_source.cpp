// Loading ds_config text: a file path, JSON text, or URL-safe base64 of JSON (as DeepSpeed
// accepts). Comments are allowed; duplicate keys are an error naming them (DeepSpeed's rule).
#include "config/config_source.h"

#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>
#include <vector>

#include "util/check.h"

namespace deepspeed::config_detail {
namespace {

bool is_regular_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::optional<std::string> base64_decode(const std::string& in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  // Only the low `bits` (< 14) bits of buf are pending; masking keeps the shift in range.
  uint32_t buf = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    if (c == '\n' || c == '\r') continue;
    int v = value(c);
    if (v < 0) return std::nullopt;
    buf = ((buf << 6) | static_cast<uint32_t>(v)) & 0xffffu;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((buf >> bits) & 0xff));
    }
  }
  return out;
}

json parse_checked(const std::string& text, const std::string& source) {
  // One set of keys per open object: the parser callback sees keys in document order.
  std::vector<std::set<std::string>> open_objects;
  std::vector<std::string> duplicates;
  json::parser_callback_t cb = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        auto key = parsed.get<std::string>();
        if (!open_objects.empty() && !open_objects.back().insert(key).second) {
          duplicates.push_back(key);
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, cb, /*allow_exceptions=*/true, /*ignore_comments=*/true);
  } catch (const json::exception& e) {
    // parse_error, and out_of_range for a number past double's range (1e400).
    throw ConfigError(source + ": not valid JSON: " + e.what());
  }
  if (!duplicates.empty()) {
    std::string list;
    for (const auto& d : duplicates) list += (list.empty() ? "" : ", ") + d;
    throw ConfigError(source + ": duplicate keys in DeepSpeed config: [" + list + "]");
  }
  if (!doc.is_object()) {
    throw ConfigError(source + ": the top level must be a JSON object, found " +
                      std::string(doc.type_name()));
  }
  return doc;
}

}  // namespace

LoadedConfig load_config_text(const std::string& config) {
  size_t first = config.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && config[first] == '{') {
    return {parse_checked(config, "ds_config"), "ds_config"};
  }
  if (is_regular_file(config)) {
    std::ifstream in(config);
    DS_CHECK(in.good(), ConfigError, config, ": cannot be opened for reading");
    std::stringstream ss;
    ss << in.rdbuf();
    return {parse_checked(ss.str(), config), config};
  }
  if (!config.empty()) {
    if (auto decoded = base64_decode(config)) {
      size_t f = decoded->find_first_not_of(" \t\r\n");
      if (f != std::string::npos && (*decoded)[f] == '{') {
        return {parse_checked(*decoded, "ds_config (base64)"), "ds_config (base64)"};
      }
    }
  }
  throw ConfigError(
      "Expected a string path to an existing deepspeed config, JSON text, or a valid base64 of "
      "JSON. Received: '" + config.substr(0, 200) + "' (no such file)");
}

}  // namespace deepspeed::config_detail

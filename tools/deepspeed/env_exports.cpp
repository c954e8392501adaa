// Multi-node exports: see env_exports.h.
#include "env_exports.h"

#include <cctype>

#include "text_util.h"
#include "usage_error.h"

namespace deepspeed::launcher {
namespace {

bool is_variable_name(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  for (char c : name) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  }
  return true;
}

bool exported(const std::string& name) {
  for (const char* prefix : kExportedPrefixes) {
    if (starts_with(name, prefix)) return true;
  }
  return false;
}

}  // namespace

std::vector<EnvVar> parse_deepspeed_env(const std::string& text, const std::string& path) {
  std::vector<EnvVar> vars;
  std::vector<std::string> lines = split(text, '\n');
  for (std::size_t i = 0; i < lines.size(); ++i) {
    std::string_view line = trim(lines[i]);
    if (line.empty() || line.front() == '#') continue;
    const std::string where = path + " line " + std::to_string(i + 1) + " '" + std::string(line) + "'";
    std::size_t eq = line.find('=');
    if (eq == std::string_view::npos) {
      throw UsageError(where + ": expected NAME=VALUE (DeepSpeed's .deepspeed_env format)");
    }
    std::string name(trim(line.substr(0, eq)));
    if (!is_variable_name(name)) {
      throw UsageError(where + ": '" + name + "' is not a variable name (letters, digits and '_', not "
                       "starting with a digit; no 'export')");
    }
    set_var(vars, name, std::string(trim(line.substr(eq + 1))));
  }
  return vars;
}

void set_var(std::vector<EnvVar>& vars, const std::string& name, const std::string& value) {
  for (EnvVar& v : vars) {
    if (v.first == name) {
      v.second = value;
      return;
    }
  }
  vars.emplace_back(name, value);
}

std::vector<EnvVar> collect_exports(const HostInfo& host) {
  std::vector<EnvVar> exports;
  bool has_pythonpath = false;
  for (const EnvVar& v : host.environment) {
    if (!exported(v.first)) continue;
    if (v.first == "PYTHONPATH") {
      has_pythonpath = true;
      set_var(exports, v.first, host.cwd + ":" + v.second);
    } else {
      set_var(exports, v.first, v.second);
    }
  }
  // Matches DeepSpeed: remote Python ranks import modules from the launch directory.
  if (!has_pythonpath) set_var(exports, "PYTHONPATH", host.cwd);
  for (const auto& [path, text] : host.deepspeed_env_files) {
    for (const EnvVar& v : parse_deepspeed_env(text, path)) set_var(exports, v.first, v.second);
  }
  return exports;
}

}  // namespace deepspeed::launcher

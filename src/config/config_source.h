// Turns the `config` argument of initialize() / ds_config into a JSON object and a source name.
#pragma once

#include <string>

#include "deepspeed/config.h"

namespace deepspeed::config_detail {

struct LoadedConfig {
  json doc;
  std::string source;  // the file path, or "ds_config" for inline JSON
};

/// A file path, JSON text (starting with '{'), or URL-safe base64 of JSON. Throws ConfigError.
LoadedConfig load_config_text(const std::string& config);

}  // namespace deepspeed::config_detail

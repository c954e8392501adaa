// Reading config.json fields with errors that name the file and key; shared by the model
// families' readers (llama_config.cpp, deepseek_config.cpp).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace deepspeed::examples {

/// j[key] as an integer; ModelFileError naming `path` and the key when missing or not one.
int64_t json_int(const nlohmann::json& j, const char* key, const std::string& path);
/// j[key] as an integer, `fallback` when absent or null.
int64_t int_or(const nlohmann::json& j, const char* key, const std::string& path,
               int64_t fallback);

}  // namespace deepspeed::examples

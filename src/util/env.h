// Every environment variable deepspeed-cpp reads goes through here (one list: docs/env.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace deepspeed::env {

/// The raw value, or nullopt when unset.
std::optional<std::string> get(const char* name);
/// An integer variable; throws ConfigError naming the variable when it is not an integer.
std::optional<int64_t> get_int(const char* name);
/// A floating-point variable; throws ConfigError naming the variable when it is not a number.
std::optional<double> get_double(const char* name);

}  // namespace deepspeed::env

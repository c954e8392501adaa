// CLI11 validators for the project's command lines. CLI11's PositiveNumber rejects 0 with "Value
// 0 not in range 0.000000 to 1.79769e+308", which reads as if 0 were allowed; this one says what
// it wants.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace deepspeed::util {

/// A number >= 1: "must be at least 1, got 0".
inline const CLI::Validator& at_least_one() {
  static const CLI::Validator check(
      [](std::string& text) -> std::string {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(text, value)) return "must be a number, got " + text;
        return value >= 1.0 ? std::string() : "must be at least 1, got " + text;
      },
      ">= 1", "AT_LEAST_ONE");
  return check;
}

}  // namespace deepspeed::util

// Small string helpers shared by the launcher's parsers (hostfile, --include/--exclude,
// .deepspeed_env, world info). Pure and locale-independent.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace deepspeed::launcher {

// `s` without leading and trailing ASCII whitespace.
std::string_view trim(std::string_view s);

// Splits at every `separator`, keeping empty pieces ("a@@b" -> {"a", "", "b"}; "" -> {""}).
std::vector<std::string> split(std::string_view text, char separator);

std::string join(const std::vector<std::string>& items, std::string_view separator);

// The value of `text` if it is only decimal digits and fits in an int, else nullopt (no sign, no
// blanks: "07" -> 7, "-1", "1.5", "" and "99999999999" -> nullopt).
std::optional<int> parse_decimal(std::string_view text);

bool starts_with(std::string_view s, std::string_view prefix);

}  // namespace deepspeed::launcher

// CPU core lists as DeepSpeed's --bind_core_list writes them ("1,3-5,7"): parsing and printing.
// Pure; the launch plan decides which rank gets which cores.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace deepspeed::launcher {

// Parses "1,3-5,7" into {1, 3, 4, 5, 7}, keeping the order written and dropping repeats.
// Throws UsageError naming `flag` and the bad item for empty items, non-numbers, negative numbers
// or a descending range ("5-3").
std::vector<int> parse_core_list(std::string_view text, std::string_view flag = "--bind_core_list");

// Formats cores compactly: {0, 1, 2, 5} -> "0-2,5". Used in messages and docs examples.
std::string format_core_list(const std::vector<int>& cores);

}  // namespace deepspeed::launcher

// Process memory figures read from /proc/self/status (Linux).
#pragma once

#include <cstdint>

namespace deepspeed::util {

/// Current and peak resident set size and VmData of this process in bytes (0 when unavailable).
struct ProcessMemory {
  int64_t rss_bytes = 0;
  int64_t peak_rss_bytes = 0;
  int64_t data_bytes = 0;  // VmData: private writable mappings (what RLIMIT_DATA bounds)
};
ProcessMemory read_process_memory();

}  // namespace deepspeed::util

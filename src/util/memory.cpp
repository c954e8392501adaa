// read_process_memory(): VmRSS, VmHWM and VmData from /proc/self/status.
#include "util/memory.h"

#include <cstdio>
#include <cstring>

namespace deepspeed::util {

ProcessMemory read_process_memory() {
  ProcessMemory m;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;
  char line[256];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    long long kb = 0;
    if (std::sscanf(line, "VmRSS: %lld kB", &kb) == 1) m.rss_bytes = kb * 1024;
    if (std::sscanf(line, "VmHWM: %lld kB", &kb) == 1) m.peak_rss_bytes = kb * 1024;
    if (std::sscanf(line, "VmData: %lld kB", &kb) == 1) m.data_bytes = kb * 1024;
  }
  std::fclose(f);
  return m;
}

}  // namespace deepspeed::util

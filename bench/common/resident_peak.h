// A step's resident-memory peak for the CPU benchmarks: VmRSS before it, VmHWM after it, with
// the high-water mark first lowered to the current size (Linux's clear_refs "5").
#pragma once

#include <fstream>
#include <string>

namespace deepspeed::bench {

/// A field of /proc/self/status in MiB ("VmRSS", "VmHWM"); 0 when absent.
inline double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string key;
  double kib = 0;
  while (in >> key) {
    if (key == field + ":") {
      in >> kib;
      return kib / 1024.0;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

/// Lowers VmHWM to the current resident size.
inline void reset_resident_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

}  // namespace deepspeed::bench

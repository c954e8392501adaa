// An imposed memory budget for the process (Linux RLIMIT_DATA): tests that must show something
// trains within less memory than it would otherwise need set it first thing in a rank process.
// RLIMIT_DATA bounds the private writable mappings (heap, mmap'd allocations such as LibTorch's
// large CPU tensors, new thread stacks, OpenBLAS's work buffer); an allocation past it fails
// (the engine's host allocator: "out of memory allocating ...") instead of swapping or invoking
// the OOM killer.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <fstream>
#include <stdexcept>
#include <string>

namespace deepspeed::testing {

/// The process's VmData (bytes of private writable mappings), from /proc/self/status.
inline int64_t vm_data_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmData:") {
      int64_t kb = 0;
      status >> kb;
      return kb * 1024;
    }
    status.ignore(1 << 16, '\n');
  }
  throw std::runtime_error("no VmData in /proc/self/status");
}

/// From now on the process may map at most `extra_bytes` more private writable memory.
inline void limit_data_memory(int64_t extra_bytes) {
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(vm_data_bytes() + extra_bytes);
  if (setrlimit(RLIMIT_DATA, &limit) != 0) throw std::runtime_error("setrlimit(RLIMIT_DATA) failed");
}

}  // namespace deepspeed::testing

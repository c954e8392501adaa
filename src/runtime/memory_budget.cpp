// DS_MEMORY_BUDGET_BYTES: see memory_budget.h.
#include "runtime/memory_budget.h"

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>

#include <ATen/ATen.h>

#include "deepspeed/errors.h"
#include "runtime/host_caching_allocator.h"
#include "util/env.h"
#include "util/logging.h"
#include "util/memory.h"

namespace deepspeed::runtime {
namespace {

std::once_flag g_once;
int64_t g_base_bytes = 0;
int64_t g_base_rss_bytes = 0;
std::optional<int64_t> g_budget;

}  // namespace

std::optional<int64_t> apply_memory_budget_from_env() {
  std::call_once(g_once, [] {
    g_budget = env::get_int("DS_MEMORY_BUDGET_BYTES");
    // The BLAS maps its work buffers at the first matrix product, their size set by the CPU
    // (OpenBLAS: tens of MiB per thread): part of the process, not of the budget. Done with or
    // without a budget, so that figures measured without one compare with runs under one.
    at::mm(at::ones({8, 8}), at::ones({8, 8}));
    g_base_bytes = util::read_process_memory().data_bytes;
    // Reset the resident high-water mark (Linux clear_refs "5"): from now on VmHWM is the peak
    // since the base, transients between samples included (ZeRO-1/2 flattening, say).
    std::FILE* clear = std::fopen("/proc/self/clear_refs", "w");
    if (clear != nullptr) {
      std::fputs("5", clear);
      std::fclose(clear);
    }
    g_base_rss_bytes = util::read_process_memory().rss_bytes;
    if (!g_budget) return;
    if (*g_budget <= 0) {
      throw ConfigError("DS_MEMORY_BUDGET_BYTES is " + std::to_string(*g_budget) +
                        "; expected a positive number of bytes");
    }
    rlimit limit{};
    limit.rlim_cur = limit.rlim_max = static_cast<rlim_t>(g_base_bytes + *g_budget);
    if (::setrlimit(RLIMIT_DATA, &limit) != 0) {
      throw ConfigError("DS_MEMORY_BUDGET_BYTES: setrlimit(RLIMIT_DATA) failed: " +
                        std::string(std::strerror(errno)));
    }
    log::info_rank0("memory budget: " + std::to_string(*g_budget / (1 << 20)) +
                    " MiB beyond the " + std::to_string(g_base_bytes / (1 << 20)) +
                    " MiB this process held at engine creation (DS_MEMORY_BUDGET_BYTES)");
  });
  return g_budget;
}

int64_t peak_resident_since_base() { return util::read_process_memory().peak_rss_bytes - g_base_rss_bytes; }

int64_t peak_mapped_since_base() {
  const auto m = util::read_process_memory();
  const int64_t not_resident =
      (m.data_bytes - g_base_bytes) - (m.rss_bytes - g_base_rss_bytes);
  return m.peak_rss_bytes - g_base_rss_bytes + std::max<int64_t>(0, not_resident);
}

int64_t live_allocated_bytes() {
  const struct mallinfo2 m = ::mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd) + host_cache_stats().in_use_bytes;
}

int64_t memory_in_use_since_base() {
  return util::read_process_memory().data_bytes - host_cache_stats().cached_bytes - g_base_bytes;
}

}  // namespace deepspeed::runtime

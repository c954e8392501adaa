// HostCachingAllocator: a CPU allocator for LibTorch that keeps freed large blocks for reuse.
// Why: glibc serves every allocation above 32 MiB with a fresh mmap, so a training step that
// allocates the same large activations every iteration (GPT's logits are 200 MB) pays for
// hundreds of thousands of page faults per step, ~40% of the step in the kernel. Reusing the
// blocks, backed by transparent huge pages where the kernel allows, removes that cost.
// Small allocations go to LibTorch's default allocator unchanged.
#pragma once

#include <cstddef>
#include <cstdint>

namespace deepspeed::runtime {

struct HostCacheStats {
  int64_t cached_bytes = 0;     // free blocks kept for reuse
  int64_t in_use_bytes = 0;     // large blocks handed out and not freed yet
  int64_t hits = 0, misses = 0;  // large allocations served from the cache / freshly mapped
};

/// Makes the caching allocator LibTorch's CPU allocator (idempotent). Blocks of at least
/// 1 MiB are cached, up to `max_cached_bytes` of free blocks. Thread-safe.
void install_host_caching_allocator(size_t max_cached_bytes = size_t{4} << 30);
bool host_caching_allocator_installed();
HostCacheStats host_cache_stats();
/// Returns every cached free block to the OS.
void empty_host_cache();

}  // namespace deepspeed::runtime

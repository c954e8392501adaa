// HostCachingAllocator implementation: size-rounded free lists of mmap'ed blocks.
#include "runtime/host_caching_allocator.h"

#include <sys/mman.h>

#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include "util/torch_compat.h"

namespace deepspeed::runtime {
namespace {

constexpr size_t kMinCachedBytes = size_t{1} << 20;  // below this, glibc's heap is fine
constexpr size_t kHugePage = size_t{2} << 20;

// Rounding makes blocks of nearby sizes interchangeable: 64 KiB steps below 4 MiB, 2 MiB (one
// huge page) steps above.
size_t round_size(size_t n) {
  const size_t step = n < (size_t{4} << 20) ? (size_t{64} << 10) : kHugePage;
  return (n + step - 1) / step * step;
}

// Every DataPtr this allocator makes has context == data and one deleter, `release`, which
// also serves as raw_deleter(): LibTorch's raw interface (raw_allocate/raw_deallocate, used by
// the oneDNN bf16 kernels on CPUs with native bf16) requires both. `release` tells our blocks
// from the fallback's small ones by the table of live blocks. A fallback without the raw
// interface (an allocator that wraps its blocks in contexts, e.g. one that counts bytes) keeps
// its small blocks as they are: raw allocations then fail in LibTorch's own check for those,
// as they would without us.
class HostCachingAllocator final : public c10::Allocator {
 public:
  explicit HostCachingAllocator(c10::Allocator* fallback, size_t max_cached)
      : fallback_(fallback), fallback_deleter_(fallback->raw_deleter()), max_cached_(max_cached) {}

  c10::DataPtr allocate(size_t n) DS_ALLOCATOR_ALLOCATE_CONST override {
    if (n < kMinCachedBytes) {
      c10::DataPtr small = fallback_->allocate(n);
      // Not raw-capable: keep it as it is, under the fallback's own deleter.
      if (fallback_deleter_ == nullptr || small.get() != small.get_context()) return small;
      // The fallback's pointers are their own contexts; hand them out under our deleter so
      // that raw_deleter() below frees them too.
      void* ptr = small.release_context();
      return {ptr, ptr, &HostCachingAllocator::release, c10::Device(c10::DeviceType::CPU)};
    }
    return const_cast<HostCachingAllocator*>(this)->allocate_large(n);
  }

  c10::DeleterFnPtr raw_deleter() const override { return &HostCachingAllocator::release; }

#if DS_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
#endif

  HostCacheStats stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  void empty() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, ptr] : free_) ::munmap(ptr, size);
    free_.clear();
    stats_.cached_bytes = 0;
  }

 private:
  c10::DataPtr allocate_large(size_t n) {
    const size_t size = round_size(n);
    void* ptr = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Best fit among blocks at most 1/8 larger, so a small tensor never pins a huge block.
      auto it = free_.lower_bound(size);
      if (it != free_.end() && it->first <= size + size / 8) {
        ptr = it->second;
        stats_.cached_bytes -= static_cast<int64_t>(it->first);
        stats_.in_use_bytes += static_cast<int64_t>(it->first);
        ++stats_.hits;
        live_.emplace(ptr, it->first);
        free_.erase(it);
        return {ptr, ptr, &HostCachingAllocator::release, c10::Device(c10::DeviceType::CPU)};
      }
      ++stats_.misses;
      stats_.in_use_bytes += static_cast<int64_t>(size);
    }
    ptr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (ptr == MAP_FAILED) {
      empty();  // give the cache back and try once more before reporting out of memory
      ptr = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (ptr == MAP_FAILED) {
        std::lock_guard<std::mutex> lock(mutex_);
        stats_.in_use_bytes -= static_cast<int64_t>(size);
        TORCH_CHECK(false, "deepspeed host allocator: out of memory allocating ", n, " bytes: ",
                    std::strerror(errno));
      }
    }
    // Huge pages where the kernel is in "madvise" mode: 512x fewer faults on first touch.
    ::madvise(ptr, size, MADV_HUGEPAGE);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.emplace(ptr, size);
    }
    return {ptr, ptr, &HostCachingAllocator::release, c10::Device(c10::DeviceType::CPU)};
  }

  static void release(void* ptr);

  void give_back(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = live_.find(ptr);
      if (it != live_.end()) {
        const size_t size = it->second;
        live_.erase(it);
        stats_.in_use_bytes -= static_cast<int64_t>(size);
        if (static_cast<size_t>(stats_.cached_bytes) + size > max_cached_) {
          ::munmap(ptr, size);
        } else {
          free_.emplace(size, ptr);
          stats_.cached_bytes += static_cast<int64_t>(size);
        }
        return;
      }
    }
    fallback_deleter_(ptr);  // a small block: the fallback allocator's own
  }

  c10::Allocator* fallback_;
  c10::DeleterFnPtr fallback_deleter_;
  size_t max_cached_;
  std::mutex mutex_;
  std::multimap<size_t, void*> free_;           // cached blocks by size
  std::unordered_map<void*, size_t> live_;      // handed-out large blocks and their sizes
  HostCacheStats stats_;
};

// Never destroyed: tensors freed during static destruction still find it.
HostCachingAllocator* g_allocator = nullptr;
std::mutex g_install_mutex;

void HostCachingAllocator::release(void* ptr) {
  if (ptr != nullptr) g_allocator->give_back(ptr);
}

}  // namespace

void install_host_caching_allocator(size_t max_cached_bytes) {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_allocator != nullptr) return;
  g_allocator = new HostCachingAllocator(c10::GetCPUAllocator(), max_cached_bytes);
  c10::SetCPUAllocator(g_allocator, /*priority=*/1);
}

bool host_caching_allocator_installed() { return g_allocator != nullptr; }

HostCacheStats host_cache_stats() { return g_allocator ? g_allocator->stats() : HostCacheStats{}; }

void empty_host_cache() {
  if (g_allocator) g_allocator->empty();
}

}  // namespace deepspeed::runtime

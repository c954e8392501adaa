// CountingAllocator: a CPU allocator wrapper that counts the bytes held through it (now and at
// peak), for tests that measure what an operation allocates.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "util/torch_compat.h"

namespace deepspeed::testing {

// The DataPtr it returns has its data pointer as context (as LibTorch's raw_allocate requires,
// which some kernels such as gelu use); the inner allocation's own context and deleter are kept in
// a table until it is freed.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
  c10::DataPtr allocate(size_t n) DS_ALLOCATOR_ALLOCATE_CONST override {
    c10::DataPtr inner = inner_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    if (data == nullptr) return inner;  // zero bytes: nothing to count
    const c10::DeleterFnPtr deleter = inner.get_deleter();
    void* ctx = inner.release_context();
    {
      std::lock_guard<std::mutex> lock(table().mutex);
      table().blocks[data] = Block{ctx, deleter, static_cast<int64_t>(n), this};
    }
    add(static_cast<int64_t>(n));
    return c10::DataPtr(data, data, &CountingAllocator::release, device);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }
#if DS_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#endif
  void reset_peak() { peak_ = live_.load(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

  /// Installs a process-wide instance in front of the current CPU allocator (once; leaked,
  /// because tensors it allocated may be freed by statics at exit) and returns it.
  static CountingAllocator& install() {
    static CountingAllocator* counting = [] {
      auto* c = new CountingAllocator(c10::GetCPUAllocator());
      c10::SetCPUAllocator(c, /*priority=*/100);
      return c;
    }();
    return *counting;
  }

 private:
  struct Block {
    void* ctx;
    c10::DeleterFnPtr deleter;
    int64_t bytes;
    const CountingAllocator* owner;
  };
  struct Table {
    std::mutex mutex;
    std::unordered_map<void*, Block> blocks;
  };
  static Table& table() {
    static auto* t = new Table();  // leaked: frees may come from statics at exit
    return *t;
  }
  static void release(void* data) {
    Block b;
    {
      std::lock_guard<std::mutex> lock(table().mutex);
      auto it = table().blocks.find(data);
      if (it == table().blocks.end()) return;
      b = it->second;
      table().blocks.erase(it);
    }
    b.owner->add(-b.bytes);
    if (b.deleter != nullptr) b.deleter(b.ctx);
  }
  void add(int64_t n) const {
    const int64_t now = live_ += n;
    int64_t prev = peak_;
    while (now > prev && !peak_.compare_exchange_weak(prev, now)) {
    }
  }
  c10::Allocator* inner_;
  mutable std::atomic<int64_t> live_{0};
  mutable std::atomic<int64_t> peak_{0};
};

}  // namespace deepspeed::testing

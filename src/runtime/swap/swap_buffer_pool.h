// SwapBufferPool: the `buffer_count` aligned host buffers through which sub-groups are swapped
// (DeepSpeed's SwapBufferManager). Each is as large as the largest sub-group, every tensor of a
// sub-group starting on an O_DIRECT boundary inside it, so transfers need no bounce copy.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>

namespace deepspeed::runtime::swap {

class SwapBufferPool {
 public:
  /// `count` buffers of `bytes` each, allocated on first use.
  SwapBufferPool(int64_t count, int64_t bytes);

  /// A free buffer's index, or -1 when all are taken.
  int acquire();
  void release(int index);
  bool any_free() const { return !free_.empty(); }
  int64_t free_count() const { return static_cast<int64_t>(free_.size()); }
  /// A view of buffer `index` from byte `offset` as `numel` elements of `dtype`.
  at::Tensor view(int index, int64_t offset, int64_t numel, at::ScalarType dtype);
  /// Bytes allocated so far.
  int64_t allocated_bytes() const;

 private:
  int64_t bytes_;
  std::vector<at::Tensor> buffers_;  // uint8, aligned; undefined until first acquired
  std::vector<int> free_;
};

/// `bytes` rounded up to the O_DIRECT alignment: where the next tensor of a sub-group starts.
int64_t aligned_bytes(int64_t bytes);

}  // namespace deepspeed::runtime::swap

// SwapBufferPool (see swap_buffer_pool.h).
#include "runtime/swap/swap_buffer_pool.h"

#include <ATen/ATen.h>

#include "deepspeed/aio.h"
#include "util/check.h"

namespace deepspeed::runtime::swap {

int64_t aligned_bytes(int64_t bytes) {
  const int64_t a = aio::kDirectIoAlignment;
  return (bytes + a - 1) / a * a;
}

SwapBufferPool::SwapBufferPool(int64_t count, int64_t bytes)
    : bytes_(bytes), buffers_(static_cast<size_t>(count)) {
  for (int i = static_cast<int>(count) - 1; i >= 0; --i) free_.push_back(i);
}

int SwapBufferPool::acquire() {
  if (free_.empty()) return -1;
  const int index = free_.back();
  free_.pop_back();
  auto& b = buffers_[static_cast<size_t>(index)];
  if (!b.defined()) b = aio::new_aligned_tensor(bytes_, at::kByte);
  return index;
}

void SwapBufferPool::release(int index) {
  DS_INTERNAL_ASSERT(index >= 0 && index < static_cast<int>(buffers_.size()));
  free_.push_back(index);
}

at::Tensor SwapBufferPool::view(int index, int64_t offset, int64_t numel, at::ScalarType dtype) {
  const int64_t nbytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  DS_INTERNAL_ASSERT(offset + nbytes <= bytes_, "a sub-group outgrew its swap buffer");
  return buffers_[static_cast<size_t>(index)].narrow(0, offset, nbytes).view(dtype);
}

int64_t SwapBufferPool::allocated_bytes() const {
  int64_t total = 0;
  for (const auto& b : buffers_) total += b.defined() ? bytes_ : 0;
  return total;
}

}  // namespace deepspeed::runtime::swap

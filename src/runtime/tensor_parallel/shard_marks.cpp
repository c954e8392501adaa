// The marks on tensor-parallel parameters (Megatron's tensor_model_parallel attributes) and the
// split / join arithmetic every layer, AutoTP and the checkpoint code share.
#include <mutex>
#include <unordered_map>

#include <torch/torch.h>

#include "deepspeed/tensor_parallel.h"
#include "util/check.h"

namespace deepspeed::tensor_parallel {
namespace {

// Keyed by the parameter's TensorImpl (set_data and ZeRO's re-pointing keep it); the weak
// reference tells a live entry from one whose parameter died and whose address was reused.
struct Mark {
  c10::weak_intrusive_ptr<c10::TensorImpl> impl;
  ShardInfo info;
};

std::mutex& marks_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const c10::TensorImpl*, Mark>& marks() {
  static std::unordered_map<const c10::TensorImpl*, Mark> m;
  return m;
}

const Mark* find_mark(const at::Tensor& param) {
  if (!param.defined()) return nullptr;
  auto it = marks().find(param.unsafeGetTensorImpl());
  if (it == marks().end()) return nullptr;
  if (it->second.impl.expired()) {
    marks().erase(it);
    return nullptr;
  }
  return &it->second;
}

}  // namespace

void mark_tensor_parallel(const at::Tensor& param, const comm::Group& group, int partition_dim,
                          int partition_stride) {
  DS_CHECK(param.defined(), UsageError, "tensor_parallel::mark_tensor_parallel: undefined tensor");
  std::lock_guard<std::mutex> lock(marks_mutex());
  marks().insert_or_assign(
      param.unsafeGetTensorImpl(),
      Mark{c10::weak_intrusive_ptr<c10::TensorImpl>(param.getIntrusivePtr()),
           ShardInfo{group, partition_dim, partition_stride}});
}

bool is_tensor_parallel(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(marks_mutex());
  return find_mark(param) != nullptr;
}

ShardInfo shard_info(const at::Tensor& param) {
  std::lock_guard<std::mutex> lock(marks_mutex());
  const Mark* m = find_mark(param);
  DS_CHECK(m != nullptr, UsageError,
           "tensor_parallel::shard_info: the tensor is not a tensor-parallel shard");
  return m->info;
}

at::Tensor shard_of(const at::Tensor& full, int dim, int parts, int index, int stride) {
  const int64_t n = full.size(dim);
  DS_CHECK(stride >= 1 && n % (static_cast<int64_t>(stride) * parts) == 0, UsageError,
           "tensor_parallel: dimension ", dim, " of size ", n, " cannot be split into ", parts,
           " parts of ", stride, " block(s) each");
  const int64_t block = n / stride, piece = block / parts;
  std::vector<at::Tensor> pieces;
  for (int s = 0; s < stride; ++s) {
    pieces.push_back(full.narrow(dim, s * block + index * piece, piece));
  }
  return (stride == 1 ? pieces[0] : at::cat(pieces, dim)).contiguous();
}

at::Tensor unshard(const std::vector<at::Tensor>& parts, int dim, int stride) {
  DS_CHECK(!parts.empty(), UsageError, "tensor_parallel::unshard: no parts");
  if (stride == 1) return at::cat(parts, dim);
  // Each part is `stride` blocks; block s of the full tensor is block s of every part in order.
  std::vector<at::Tensor> blocks;
  for (int s = 0; s < stride; ++s) {
    for (const auto& p : parts) {
      const int64_t piece = p.size(dim) / stride;
      blocks.push_back(p.narrow(dim, s * piece, piece));
    }
  }
  return at::cat(blocks, dim);
}

}  // namespace deepspeed::tensor_parallel

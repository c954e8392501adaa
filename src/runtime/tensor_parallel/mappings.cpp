// Megatron's four region functions (mappings.py) as autograd functions over a comm::Group.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/torch.h>

#include "comm/autograd_group.h"
#include "deepspeed/tensor_parallel.h"
#include "util/check.h"

namespace deepspeed::tensor_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using comm::save_group;
using comm::saved_group;

at::Tensor all_reduce_sum(const at::Tensor& x, const comm::Group& group) {
  at::Tensor out = x.contiguous().clone();
  comm::all_reduce(out, comm::ReduceOp::kSum, false, group);
  return out;
}

// This rank's slice of the last dimension, contiguous.
at::Tensor split_last(const at::Tensor& x, const comm::Group& group) {
  const int64_t n = x.size(-1);
  if (n % group.size() != 0) {
    throw UsageError("tensor_parallel: the last dimension (" + std::to_string(n) +
                     ") is not divisible by the tensor-parallel size (" +
                     std::to_string(group.size()) + ") of group " + group.describe());
  }
  const int64_t part = n / group.size();
  return x.narrow(-1, group.rank() * part, part).contiguous();
}

// The ranks' tensors concatenated along the last dimension, in group-rank order.
at::Tensor gather_last(const at::Tensor& x, const comm::Group& group) {
  at::Tensor in = x.contiguous();
  at::Tensor flat = at::empty({group.size() * in.numel()}, in.options());
  comm::all_gather(flat, in, false, group);
  std::vector<int64_t> shape = in.sizes().vec();
  shape.insert(shape.begin(), group.size());
  // [T, ..., n] -> [..., T * n]: move the rank axis next to the last one, then merge.
  at::Tensor stacked = flat.view(shape).movedim(0, -2);
  std::vector<int64_t> out_shape = in.sizes().vec();
  out_shape.back() *= group.size();
  return stacked.reshape(out_shape);
}

class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group) {
    save_group(ctx, group);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduce_sum(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x, comm::Group group) {
    return all_reduce_sum(x, group);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

class ScatterToRegion : public torch::autograd::Function<ScatterToRegion> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group) {
    save_group(ctx, group);
    return split_last(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {gather_last(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

class GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, comm::Group group) {
    save_group(ctx, group);
    return gather_last(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {split_last(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_model_parallel_region(const at::Tensor& x, const comm::Group& group) {
  if (group.size() == 1) return x;
  return CopyToRegion::apply(x, group);
}

at::Tensor reduce_from_model_parallel_region(const at::Tensor& x, const comm::Group& group) {
  if (group.size() == 1) return x;
  return ReduceFromRegion::apply(x, group);
}

at::Tensor scatter_to_model_parallel_region(const at::Tensor& x, const comm::Group& group) {
  if (group.size() == 1) return x;
  return ScatterToRegion::apply(x, group);
}

at::Tensor gather_from_model_parallel_region(const at::Tensor& x, const comm::Group& group) {
  if (group.size() == 1) return x;
  return GatherFromRegion::apply(x, group);
}

}  // namespace deepspeed::tensor_parallel

// The two pieces of gradient bucketing that every reducer (stage 0 GradReducer, stages 1/2
// PartitionedGradReducer, stage 3 Stage3GradReducer) shares:
//
// plan_buckets: the static bucket plan (Note [Static buckets]). Items are taken in reverse
// order, the order in which backward usually finishes gradients; as in DeepSpeed a bucket is
// closed once adding the next item would exceed the limit, so an item larger than the limit
// gets a bucket of its own, and items of different keys (dtypes) never share one. Fixed at
// construction, the plan makes every rank issue the same collectives in the same order.
//
// GradReadyHooks: a post hook on each parameter's AccumulateGrad node, which fires once
// autograd has accumulated this backward's gradient into param.grad; removed again when the
// hooks go (the model may outlive the engine).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

namespace torch::autograd {
struct Node;
}

namespace deepspeed::runtime {

struct BucketPlan {
  std::vector<std::vector<size_t>> items;  // per bucket: item indices, in fill order
  std::vector<size_t> bucket_of;           // per item: its bucket
  std::vector<size_t> slot_of;             // per item: its position in the bucket's items
};

/// Plans buckets over items of `sizes` (elements each item takes in a bucket) with at most
/// `limit` elements per bucket unless one item alone is larger. `keys`, when given (one per
/// item), keep items with different keys apart.
BucketPlan plan_buckets(const std::vector<int64_t>& sizes, int64_t limit,
                        const std::vector<int>& keys = {});

class GradReadyHooks {
 public:
  /// Calls `on_ready(i)` after `params[i]`'s gradient is accumulated in each backward.
  GradReadyHooks(const std::vector<at::Tensor>& params, std::function<void(size_t)> on_ready);
  ~GradReadyHooks();
  GradReadyHooks(const GradReadyHooks&) = delete;
  GradReadyHooks& operator=(const GradReadyHooks&) = delete;

 private:
  class Hook;
  std::function<void(size_t)> on_ready_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
};

}  // namespace deepspeed::runtime

// The gradient bucketing that every reducer (stage 0 GradReducer, stages 1/2
// PartitionedGradReducer, stage 3 Stage3GradReducer) shares; a reducer keeps only what its
// stage does with a bucket (how a gradient is laid out in it, the collective, where the result
// goes):
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
//
// Bucketer: the in-order launch and the buffer pool (Note [Static buckets]). It counts the
// gradients still missing per bucket, launches buckets strictly in index order, hands each a
// buffer from its pool (waiting for the oldest bucket in flight when none is free) and
// completes launched buckets in launch order. The collective and the copies are injected
// (BucketOps), so a fake collective can drive it in one process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include <ATen/core/Tensor.h>

#include "deepspeed/comm.h"

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

// Note [Static buckets]: the bucket of every parameter is fixed at construction and buckets are
// launched strictly in index order, so every rank issues the same collectives in the same order
// even when autograd visits parameters differently or some get no gradient. A gradient that
// arrives before its bucket may take a buffer stays in param.grad until then.

/// What a reducer does with a bucket; the Bucketer decides when. `buffer` is an index into the
/// reducer's buffers (0 .. Bucketer::num_buffers() - 1).
struct BucketOps {
  /// Copies item `slot` of `bucket` into `buffer`: its gradient, or zeros when it has none.
  /// `ready`: whether the item's gradient was reported ready in this backward. Called once per
  /// item and backward, before the bucket launches.
  std::function<void(size_t bucket, size_t slot, size_t buffer, bool ready)> fill;
  /// The collective: scales the bucket in `buffer` and starts its reduction; returns the
  /// handles to wait for (none for a synchronous or fake collective).
  std::function<std::vector<comm::Handle>(size_t bucket, size_t buffer)> launch;
  /// After the handles completed: takes the reduced bucket out of `buffer`.
  std::function<void(size_t bucket, size_t buffer)> complete;
};

struct BucketerOptions {
  /// Buffers in the pool: 1 (each bucket completes before the next is filled), 2 (one fills
  /// while the other is in flight), or kBufferPerBucket (buffer b belongs to bucket b and keeps
  /// its result until the next backward: stage 0's gradients are views of it).
  size_t buffers = 1;
  static constexpr size_t kBufferPerBucket = 0;
  /// Complete each bucket inside the call that launched it (overlap_comm false).
  bool complete_on_launch = true;
  /// Copy a ready gradient into its bucket at once when the bucket can take it
  /// (contiguous_gradients); otherwise every copy waits for the bucket's launch.
  bool fill_on_ready = true;
};

class Bucketer {
 public:
  Bucketer(BucketPlan plan, BucketerOptions options, BucketOps ops);

  /// Arms for the coming backward: every item pending, no bucket launched, counters zeroed.
  void prepare();
  /// Item `item`'s gradient is ready: fills it when its bucket can take it and launches every
  /// bucket, in order, whose items are all ready. The caller checks (with ready() and
  /// launched()) that the item was not reported twice nor after its bucket launched.
  void on_ready(size_t item);
  /// After backward: launches what is left, in order (missing items count as ready, filled
  /// with ready=false), and completes every bucket in flight. Disarms.
  void flush();

  bool armed() const { return armed_; }
  bool ready(size_t item) const { return ready_[item]; }
  /// Whether `bucket` was launched in this backward.
  bool launched(size_t bucket) const { return bucket < next_to_launch_; }
  const BucketPlan& plan() const { return plan_; }
  size_t num_buckets() const { return plan_.items.size(); }
  /// How many buffers the reducer provides (0 when there are no buckets).
  size_t num_buffers() const { return num_buffers_; }
  /// In the last backward: buckets launched, of those while autograd ran (not in flush), and
  /// handles the collective returned.
  int64_t buckets_launched() const { return launched_; }
  int64_t buckets_launched_from_hooks() const { return launched_from_hooks_; }
  int64_t collectives_issued() const { return collectives_; }

 private:
  size_t buffer_for(size_t bucket);
  void launch_ready();
  void launch(size_t bucket);
  void complete_oldest();
  bool per_bucket() const { return options_.buffers == BucketerOptions::kBufferPerBucket; }

  BucketPlan plan_;
  BucketerOptions options_;
  BucketOps ops_;
  size_t num_buffers_ = 0;
  std::vector<size_t> pending_;    // per bucket: items not yet ready
  std::vector<int64_t> buffer_of_;  // per bucket: its buffer while it holds one, else -1
  std::vector<std::vector<comm::Handle>> handles_;  // per bucket in flight
  std::vector<bool> ready_;        // per item
  std::vector<bool> filled_;       // per item
  std::vector<size_t> free_;       // pool: free buffers
  std::deque<size_t> in_flight_;   // buckets launched and not completed, in launch order
  size_t next_to_launch_ = 0;
  bool armed_ = false;
  bool flushing_ = false;
  int64_t launched_ = 0;
  int64_t launched_from_hooks_ = 0;
  int64_t collectives_ = 0;
};

}  // namespace deepspeed::runtime

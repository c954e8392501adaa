// Stage3GradReducer implementation (see the header).
#include "runtime/zero/stage3_grad_reducer.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {

Stage3GradReducer::Stage3GradReducer(std::vector<PartitionedParam>* params,
                                     std::vector<size_t> trainable,
                                     std::vector<at::Tensor> grad_shards,
                                     Stage3ReducerOptions options)
    : params_(params), trainable_(std::move(trainable)), grad_shards_(std::move(grad_shards)),
      options_(options), world_(options_.group.size()), rank_(options_.group.rank()) {
  DS_INTERNAL_ASSERT(options_.group.is_member(),
                     "Stage3GradReducer needs this rank's data-parallel group");
  DS_CHECK(options_.bucket_numel > 0, ConfigError,
           "zero_optimization.reduce_bucket_size must be positive");
  const size_t n = trainable_.size();
  // A bucket holds W chunks of each member's shard size: its padded size counts.
  std::vector<int64_t> sizes;
  for (size_t k : trainable_) sizes.push_back((*params_)[k].padded_numel(world_));
  BucketPlan plan = plan_buckets(sizes, options_.bucket_numel);
  bucket_of_ = std::move(plan.bucket_of);
  member_of_ = std::move(plan.slot_of);
  for (auto& items : plan.items) {
    Bucket b;
    for (size_t k : items) {
      b.offsets.push_back(b.region);
      b.region += (*params_)[trainable_[k]].shard_numel;
    }
    b.members = std::move(items);
    buckets_.push_back(std::move(b));
  }
  ready_.assign(n, false);
  copied_.assign(n, false);

  int64_t largest = 0;
  for (const auto& b : buckets_) largest = std::max(largest, b.region);
  if (largest > 0) {
    const at::Tensor& any = (*params_)[trainable_[0]].param;
    const auto o = at::TensorOptions().dtype(options_.bucket_dtype).device(any.device());
    for (int i = 0; i < (options_.overlap_comm ? 2 : 1); ++i) {
      send_buffers_.push_back(at::empty({largest * world_}, o));
      receive_buffers_.push_back(options_.reduce_scatter ? at::empty({largest}, o) : at::Tensor());
      free_buffers_.push_back(i);
    }
  }
  std::vector<at::Tensor> hooked;
  for (size_t k : trainable_) hooked.push_back((*params_)[k].param);
  hooks_ = std::make_unique<GradReadyHooks>(hooked, [this](size_t k) { on_grad_ready(k); });
}

Stage3GradReducer::~Stage3GradReducer() = default;

void Stage3GradReducer::prepare() {
  for (auto& b : buckets_) {
    b.pending = b.members.size();
    DS_INTERNAL_ASSERT(b.buffer < 0, "a bucket kept its buffer across backward passes");
  }
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(copied_.begin(), copied_.end(), false);
  next_to_launch_ = 0;
  stats_ = ReductionStats{};
  armed_ = true;
}

at::Tensor Stage3GradReducer::send_view(const Bucket& b) const {
  return send_buffers_[static_cast<size_t>(b.buffer)].narrow(0, 0, b.region * world_);
}

at::Tensor Stage3GradReducer::receive_view(const Bucket& b) const {
  if (options_.reduce_scatter) {
    return receive_buffers_[static_cast<size_t>(b.buffer)].narrow(0, 0, b.region);
  }
  return send_view(b).narrow(0, static_cast<int64_t>(rank_) * b.region, b.region);
}

void Stage3GradReducer::on_grad_ready(size_t k) {
  if (!armed_) return;
  const PartitionedParam& p = (*params_)[trainable_[k]];
  DS_CHECK(!ready_[k], UsageError, "the gradient of '", p.name,
           "' was computed twice in one backward; call engine.backward() once per micro-batch");
  DS_CHECK(bucket_of_[k] >= next_to_launch_, UsageError, "the gradient of '", p.name,
           "' arrived after its bucket was reduced");
  ready_[k] = true;
  Bucket& b = buckets_[bucket_of_[k]];
  if (options_.contiguous_gradients && bucket_of_[k] == next_to_launch_) {
    acquire_buffer(b);
    copy_in(b, member_of_[k]);
  }
  if (--b.pending == 0) launch_ready();
}

void Stage3GradReducer::copy_in(Bucket& b, size_t m) {
  const size_t k = b.members[m];
  if (copied_[k]) return;
  at::Tensor param = (*params_)[trainable_[k]].param;
  const int64_t n = param.numel();
  const int64_t s = (*params_)[trainable_[k]].shard_numel;
  // [W, region] view: row r is rank r's region; this parameter's chunks form one column block.
  at::Tensor dst = send_view(b).view({world_, b.region}).narrow(1, b.offsets[m], s);
  const at::Tensor& grad = param.grad();
  if (!grad.defined() || s == 0) {
    dst.zero_();
  } else {
    at::Tensor g = grad.reshape({-1});
    const int64_t full_rows = n / s;
    const int64_t rest = n % s;
    if (full_rows > 0) dst.narrow(0, 0, full_rows).copy_(g.narrow(0, 0, full_rows * s).view({full_rows, s}));
    if (full_rows < world_) {
      dst.narrow(0, full_rows, world_ - full_rows).zero_();
      if (rest > 0) dst.select(0, full_rows).narrow(0, 0, rest).copy_(g.narrow(0, full_rows * s, rest));
    }
  }
  param.mutable_grad() = at::Tensor();  // this rank keeps only its chunk, in the shard
  copied_[k] = true;
}

void Stage3GradReducer::acquire_buffer(Bucket& b) {
  if (b.buffer >= 0) return;
  if (free_buffers_.empty()) complete_oldest();
  DS_INTERNAL_ASSERT(!free_buffers_.empty(), "no reduction buffer came free");
  b.buffer = free_buffers_.back();
  free_buffers_.pop_back();
}

void Stage3GradReducer::launch_ready() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void Stage3GradReducer::launch(Bucket& b) {
  acquire_buffer(b);
  for (size_t m = 0; m < b.members.size(); ++m) copy_in(b, m);
  at::Tensor send = send_view(b);
  // Matches DeepSpeed's stage 3: divide by W, then sum (reference §7.1).
  if (options_.average && world_ > 1) send.mul_(1.0 / world_);
  if (options_.reduce_scatter) {
    at::Tensor receive = receive_view(b);
    b.handle = comm::reduce_scatter(receive, send, comm::ReduceOp::kSum, /*async_op=*/true,
                                    options_.group);
  } else {
    b.handle = comm::all_reduce(send, comm::ReduceOp::kSum, /*async_op=*/true, options_.group);
  }
  stats_.buckets_launched += 1;
  stats_.reductions_issued += 1;
  if (!in_finish_) stats_.buckets_launched_from_hooks += 1;
  in_flight_.push_back(static_cast<size_t>(&b - buckets_.data()));
  if (!options_.overlap_comm) complete_oldest();
}

void Stage3GradReducer::complete_oldest() {
  DS_INTERNAL_ASSERT(!in_flight_.empty(), "no reduction in flight");
  Bucket& b = buckets_[in_flight_.front()];
  in_flight_.pop_front();
  b.handle.wait();
  b.handle = comm::Handle();
  at::Tensor mine = receive_view(b);
  for (size_t m = 0; m < b.members.size(); ++m) {
    at::Tensor& shard = grad_shards_[b.members[m]];
    shard.add_(mine.narrow(0, b.offsets[m], shard.numel()));
  }
  free_buffers_.push_back(b.buffer);
  b.buffer = -1;
}

void Stage3GradReducer::finish() {
  if (!armed_) return;
  if (!options_.ignore_unused_parameters) {
    for (size_t k = 0; k < ready_.size(); ++k) {
      const PartitionedParam& p = (*params_)[trainable_[k]];
      DS_CHECK(ready_[k] || p.param.grad().defined(), UsageError, "parameter '", p.name,
               "' got no gradient in this backward (it is unused by the forward pass) while "
               "zero_optimization.ignore_unused_parameters is false");
    }
  }
  for (auto& b : buckets_) b.pending = 0;
  in_finish_ = true;
  launch_ready();
  while (!in_flight_.empty()) complete_oldest();
  in_finish_ = false;
  armed_ = false;
}

int64_t Stage3GradReducer::buffer_bytes() const {
  int64_t total = 0;
  for (const auto& t : send_buffers_) total += t.numel() * static_cast<int64_t>(t.element_size());
  for (const auto& t : receive_buffers_) {
    if (t.defined()) total += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return total;
}

}  // namespace deepspeed::runtime

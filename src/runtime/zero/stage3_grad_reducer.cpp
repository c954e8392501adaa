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
  // A bucket holds W chunks of each member's shard size: its padded size counts.
  std::vector<int64_t> sizes;
  std::vector<int> dtypes;  // each parameter's reduction dtype: buckets never mix them
  for (size_t k : trainable_) {
    const PartitionedParam& p = (*params_)[k];
    sizes.push_back(p.padded_numel(world_));
    dtypes.push_back(
        static_cast<int>(comm_dtype_of(options_.comm_dtypes, p.param, options_.bucket_dtype)));
  }
  BucketPlan plan = plan_buckets(sizes, options_.bucket_numel, dtypes);
  for (const auto& items : plan.items) {
    Bucket b;
    b.index = buckets_.size();
    b.dtype = static_cast<at::ScalarType>(dtypes[items.front()]);
    for (size_t k : items) {
      b.offsets.push_back(b.region);
      b.region += (*params_)[trainable_[k]].shard_numel;
    }
    b.members = items;
    buckets_.push_back(std::move(b));
  }
  if (options_.quantized_reduction && options_.loco) {
    loco_ = std::make_unique<LocoErrorFeedback>(*options_.loco, buckets_.size());
  }
  BucketerOptions bucketing;
  bucketing.buffers = options_.overlap_comm ? 2 : 1;
  bucketing.complete_on_launch = !options_.overlap_comm;
  bucketing.fill_on_ready = options_.contiguous_gradients;
  BucketOps ops;
  ops.fill = [this](size_t b, size_t m, size_t buffer, bool) { fill(buckets_[b], m, buffer); };
  ops.launch = [this](size_t b, size_t buffer) { return launch(buckets_[b], buffer); };
  ops.complete = [this](size_t b, size_t buffer) { complete(buckets_[b], buffer); };
  bucketer_ = std::make_unique<Bucketer>(std::move(plan), bucketing, std::move(ops));

  std::map<at::ScalarType, int64_t> largest;
  for (const auto& b : buckets_) largest[b.dtype] = std::max(largest[b.dtype], b.region);
  const at::Device device = (*params_)[trainable_[0]].param.device();
  for (const auto& [dtype, region] : largest) {
    const auto o = at::TensorOptions().dtype(dtype).device(device);
    for (size_t i = 0; i < bucketer_->num_buffers(); ++i) {
      send_buffers_[dtype].push_back(at::empty({region * world_}, o));
      receive_buffers_[dtype].push_back(options_.reduce_scatter ? at::empty({region}, o)
                                                                : at::Tensor());
    }
  }
  if (options_.quantized_reduction) quantized_in_flight_.resize(bucketer_->num_buffers());
  if (options_.host_shards && bucketer_->num_buffers() > 0) {
    d2h_ = std::make_unique<SideStream>(device);
    copies_read_.assign(bucketer_->num_buffers(), false);
  }
  std::vector<at::Tensor> hooked;
  for (size_t k : trainable_) hooked.push_back((*params_)[k].param);
  hooks_ = std::make_unique<GradReadyHooks>(hooked, [this](size_t k) { on_grad_ready(k); });
}

Stage3GradReducer::~Stage3GradReducer() = default;

void Stage3GradReducer::prepare() {
  host_copies_ = 0;
  bucketer_->prepare();
}

ReductionStats Stage3GradReducer::stats() const {
  ReductionStats stats;
  stats.buckets_launched = bucketer_->buckets_launched();
  stats.buckets_launched_from_hooks = bucketer_->buckets_launched_from_hooks();
  stats.reductions_issued = bucketer_->collectives_issued();
  stats.host_copies_in_backward = host_copies_;
  return stats;
}

at::Tensor Stage3GradReducer::send_view(const Bucket& b, size_t buffer) const {
  return send_buffers_.at(b.dtype)[buffer].narrow(0, 0, b.region * world_);
}

at::Tensor Stage3GradReducer::receive_view(const Bucket& b, size_t buffer) const {
  if (options_.reduce_scatter) return receive_buffers_.at(b.dtype)[buffer].narrow(0, 0, b.region);
  return send_view(b, buffer).narrow(0, static_cast<int64_t>(rank_) * b.region, b.region);
}

void Stage3GradReducer::on_grad_ready(size_t k) {
  if (!bucketer_->armed()) return;
  const PartitionedParam& p = (*params_)[trainable_[k]];
  DS_CHECK(!bucketer_->ready(k), UsageError, "the gradient of '", p.name,
           "' was computed twice in one backward; call engine.backward() once per micro-batch");
  DS_CHECK(!bucketer_->launched(bucketer_->plan().bucket_of[k]), UsageError, "the gradient of '",
           p.name, "' arrived after its bucket was reduced");
  bucketer_->on_ready(k);
}

void Stage3GradReducer::fill(const Bucket& b, size_t m, size_t buffer) {
  wait_for_copies_from(buffer);
  const size_t k = b.members[m];
  at::Tensor param = (*params_)[trainable_[k]].param;
  const int64_t n = param.numel();
  const int64_t s = (*params_)[trainable_[k]].shard_numel;
  // [W, region] view: row r is rank r's region; this parameter's chunks form one column block.
  at::Tensor dst = send_view(b, buffer).view({world_, b.region}).narrow(1, b.offsets[m], s);
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
}

std::vector<comm::Handle> Stage3GradReducer::launch(const Bucket& b, size_t buffer) {
  wait_for_copies_from(buffer);
  at::Tensor send = send_view(b, buffer);
  // Matches DeepSpeed's stage 3: divide by W, then sum (reference §7.1).
  const int divisor = options_.average_divisor > 0 ? options_.average_divisor : world_;
  if (options_.average && divisor > 1) send.mul_(1.0 / divisor);
  if (options_.quantized_reduction) {
    LocoBucketErrors* errors = loco_ ? &loco_->begin_reduction(b.index) : nullptr;
    QuantizedReductionInFlight& flight = quantized_in_flight_[buffer];
    flight = start_quantized_reduce_scatter(send.view({world_, b.region}),
                                            *options_.quantized_reduction, errors);
    std::vector<comm::Handle> handles;  // the Bucketer waits for them before complete()
    handles.swap(flight.handles);
    return handles;
  }
  if (options_.reduce_scatter) {
    at::Tensor receive = receive_view(b, buffer);
    return {comm::reduce_scatter(receive, send, comm::ReduceOp::kSum, /*async_op=*/true,
                                 options_.group)};
  }
  return {comm::all_reduce(send, comm::ReduceOp::kSum, /*async_op=*/true, options_.group)};
}

void Stage3GradReducer::complete(const Bucket& b, size_t buffer) {
  if (options_.quantized_reduction) {  // the second stage (Note [Quantized reduction])
    at::Tensor receive = receive_view(b, buffer);
    finish_quantized_reduce_scatter(quantized_in_flight_[buffer], receive,
                                    *options_.quantized_reduction);
  }
  if (d2h_) return copy_to_host_shards(b, buffer);
  at::Tensor mine = receive_view(b, buffer);
  for (size_t m = 0; m < b.members.size(); ++m) {
    at::Tensor& shard = grad_shards_[b.members[m]];
    at::Tensor part = mine.narrow(0, b.offsets[m], shard.numel());
    shard.add_(part);
  }
}

void Stage3GradReducer::copy_to_host_shards(const Bucket& b, size_t buffer) {
  const at::Tensor mine = receive_view(b, buffer);
  const bool add = !shards_zero_;
  d2h_->enqueue_after_current([&] {
    for (size_t m = 0; m < b.members.size(); ++m) {
      at::Tensor& shard = grad_shards_[b.members[m]];
      const at::Tensor part = mine.narrow(0, b.offsets[m], shard.numel());
      if (!add) {
        shard.copy_(part, /*non_blocking=*/true);
        continue;
      }
      // A later micro-step adds where the bucket is: the shard's sum so far crosses to the
      // device, takes its chunk there and crosses back. One shard at a time, so the device
      // holds one shard's temporary, not a bucket's; allocated on the side stream, so the
      // caching allocator hands the block out again only after this stream's copies.
      at::Tensor sum = shard.to(part.device(), /*non_blocking=*/true);
      sum.add_(part);
      shard.copy_(sum, /*non_blocking=*/true);
    }
  });
  copies_read_[buffer] = true;
  ++host_copies_;
}

void Stage3GradReducer::wait_for_copies_from(size_t buffer) {
  if (!d2h_ || !copies_read_[buffer]) return;
  d2h_->current_waits();
  copies_read_[buffer] = false;
}

void Stage3GradReducer::finish() {
  if (!bucketer_->armed()) return;
  if (!options_.ignore_unused_parameters) {
    for (size_t k = 0; k < trainable_.size(); ++k) {
      const PartitionedParam& p = (*params_)[trainable_[k]];
      DS_CHECK(bucketer_->ready(k) || p.param.grad().defined(), UsageError, "parameter '", p.name,
               "' got no gradient in this backward (it is unused by the forward pass) while "
               "zero_optimization.ignore_unused_parameters is false");
    }
  }
  bucketer_->flush();
  if (d2h_) {
    d2h_->synchronize();
    copies_read_.assign(copies_read_.size(), false);
  }
  shards_zero_ = false;
}

void Stage3GradReducer::loss_scale_updated(bool overflow, double ratio) {
  if (loco_) loco_->loss_scale_updated(overflow, ratio);
}

int64_t Stage3GradReducer::buffer_bytes() const {
  int64_t total = loco_ ? loco_->bytes() : 0;  // LoCo's errors, kept between reductions
  for (const auto* pools : {&send_buffers_, &receive_buffers_}) {
    for (const auto& [dtype, pool] : *pools) {
      for (const auto& t : pool) {
        if (t.defined()) total += t.numel() * static_cast<int64_t>(t.element_size());
      }
    }
  }
  return total;
}

}  // namespace deepspeed::runtime

// GradReducer implementation (see the header, and Note [Bucket order]).
#include "runtime/grad_reducer.h"

#include <chrono>

#include <ATen/ATen.h>

#include "util/check.h"

namespace deepspeed::runtime {

GradReducer::GradReducer(std::vector<at::Tensor> params, GradReducerOptions options)
    : params_(std::move(params)), options_(options), world_size_(options_.group.size()) {
  DS_INTERNAL_ASSERT(options_.group.is_member(), "GradReducer needs this rank's data-parallel group");
  DS_CHECK(options_.bucket_numel > 0, ConfigError,
           "zero_optimization.reduce_bucket_size must be positive");
  const size_t n = params_.size();
  ready_.assign(n, false);
  // Matches DeepSpeed: a bucket is closed once adding the next gradient would exceed it;
  // dtypes are never mixed in one bucket.
  std::vector<int64_t> sizes(n);
  std::vector<int> dtypes(n);
  for (size_t k = 0; k < n; ++k) {
    sizes[k] = params_[k].numel();
    dtypes[k] = static_cast<int>(params_[k].scalar_type());
  }
  BucketPlan plan = plan_buckets(sizes, options_.bucket_numel, dtypes);
  bucket_of_ = std::move(plan.bucket_of);
  slot_in_bucket_ = std::move(plan.slot_of);
  for (auto& items : plan.items) {
    Bucket b;
    int64_t numel = 0;
    for (size_t k : items) {
      b.offsets.push_back(numel);
      numel += sizes[k];
    }
    b.flat = at::zeros({numel}, params_[items[0]].options());
    b.params = std::move(items);
    buckets_.push_back(std::move(b));
  }
  hooks_ = std::make_unique<GradReadyHooks>(params_, [this](size_t i) { on_grad_ready(i); });
}

GradReducer::~GradReducer() = default;

void GradReducer::prepare() {
  for (auto& b : buckets_) {
    b.pending = b.params.size();
    b.launched = false;
    b.handle = comm::Handle();
  }
  std::fill(ready_.begin(), ready_.end(), false);
  next_to_launch_ = 0;
  launched_ = 0;
  launched_from_hooks_ = 0;
  armed_ = true;
}

void GradReducer::on_grad_ready(size_t i) {
  if (!armed_) return;
  Bucket& b = buckets_[bucket_of_[i]];
  DS_CHECK(!ready_[i], UsageError, "the gradient of parameter #", i,
           " was computed twice in one backward on the accumulation boundary; call "
           "engine.backward() once per micro-batch");
  DS_CHECK(!b.launched, UsageError, "the gradient of parameter #", i,
           " arrived after its bucket was reduced");
  ready_[i] = true;
  const at::Tensor& g = params_[i].grad();
  at::Tensor slot = b.flat.narrow(0, b.offsets[slot_in_bucket_[i]], params_[i].numel());
  if (g.defined()) {
    slot.copy_(g.reshape({-1}));
  } else {
    slot.zero_();
  }
  if (--b.pending == 0) launch_ready_buckets();
}

void GradReducer::launch_ready_buckets() {
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    launch(buckets_[next_to_launch_]);
    ++next_to_launch_;
  }
}

void GradReducer::launch(Bucket& b) {
  // Parameters that got no gradient this backward (unused or frozen by control flow) count as
  // zeros, so every rank reduces the same sizes (Matches DeepSpeed's ZeRO-0 fallback).
  for (size_t s = 0; s < b.params.size(); ++s) {
    if (!ready_[b.params[s]]) b.flat.narrow(0, b.offsets[s], params_[b.params[s]].numel()).zero_();
  }
  if (options_.average) {
    // Matches DeepSpeed (reference §7.1): prescale divides by W before the sum; postscale
    // divides by the predivide factor f before and multiplies by f/W after.
    if (options_.prescale) {
      b.flat.mul_(1.0 / world_size_);
    } else if (options_.predivide_factor != 1.0) {
      b.flat.mul_(1.0 / options_.predivide_factor);
    }
  }
  b.pending = 0;
  b.launched = true;
  ++launched_;
  if (!in_finish_) ++launched_from_hooks_;
  b.handle = comm::all_reduce(b.flat, comm::ReduceOp::kSum, /*async_op=*/true, options_.group);
}

void GradReducer::finish() {
  if (!armed_) return;
  auto t0 = std::chrono::steady_clock::now();
  for (auto& b : buckets_) b.pending = 0;  // what is left launches now, in order
  in_finish_ = true;
  launch_ready_buckets();
  in_finish_ = false;
  for (auto& b : buckets_) {
    b.handle.wait();
    if (options_.average && !options_.prescale &&
        options_.predivide_factor != static_cast<double>(world_size_)) {
      b.flat.mul_(options_.predivide_factor / world_size_);
    }
    for (size_t s = 0; s < b.params.size(); ++s) {
      at::Tensor& p = params_[b.params[s]];
      // The gradient becomes a view of the bucket until zero_grad() drops it.
      p.mutable_grad() = b.flat.narrow(0, b.offsets[s], p.numel()).view(p.sizes());
    }
  }
  armed_ = false;
  last_wait_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t GradReducer::bucket_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
  return total;
}

}  // namespace deepspeed::runtime

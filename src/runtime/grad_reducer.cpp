// GradReducer implementation (see the header, and Note [Bucket order]).
#include "runtime/grad_reducer.h"

#include <chrono>

#include <ATen/ATen.h>

#include "runtime/sparse_grad.h"
#include "util/check.h"

namespace deepspeed::runtime {

GradReducer::GradReducer(std::vector<at::Tensor> params, GradReducerOptions options)
    : options_(std::move(options)),
      world_size_(options_.average_divisor > 0 ? options_.average_divisor : options_.group.size()) {
  for (auto& p : params) {
    (options_.sparse.count(p.unsafeGetTensorImpl()) ? sparse_params_ : params_).push_back(p);
  }
  DS_INTERNAL_ASSERT(options_.group.is_member(), "GradReducer needs this rank's data-parallel group");
  DS_CHECK(options_.bucket_numel > 0, ConfigError,
           "zero_optimization.reduce_bucket_size must be positive");
  const size_t n = params_.size();
  // Matches DeepSpeed: a bucket is closed once adding the next gradient would exceed it;
  // dtypes are never mixed in one bucket.
  std::vector<int64_t> sizes(n);
  std::vector<int> dtypes(n);
  for (size_t k = 0; k < n; ++k) {
    sizes[k] = params_[k].numel();
    dtypes[k] = static_cast<int>(params_[k].scalar_type());
  }
  BucketPlan plan = plan_buckets(sizes, options_.bucket_numel, dtypes);
  for (const auto& items : plan.items) {
    Bucket b;
    int64_t numel = 0;
    for (size_t k : items) {
      b.offsets.push_back(numel);
      numel += sizes[k];
    }
    b.flat = at::zeros({numel}, params_[items[0]].options());
    b.params = items;
    buckets_.push_back(std::move(b));
  }
  BucketerOptions bucketing;
  bucketing.buffers = BucketerOptions::kBufferPerBucket;
  bucketing.complete_on_launch = false;  // every bucket completes in finish()
  bucketing.fill_on_ready = true;
  BucketOps ops;
  ops.fill = [this](size_t b, size_t slot, size_t, bool ready) { fill(buckets_[b], slot, ready); };
  ops.launch = [this](size_t b, size_t) { return launch(buckets_[b]); };
  ops.complete = [this](size_t b, size_t) { complete(buckets_[b]); };
  bucketer_ = std::make_unique<Bucketer>(std::move(plan), bucketing, std::move(ops));
  hooks_ = std::make_unique<GradReadyHooks>(params_, [this](size_t i) { on_grad_ready(i); });
}

GradReducer::~GradReducer() = default;

void GradReducer::prepare() { bucketer_->prepare(); }

void GradReducer::on_grad_ready(size_t i) {
  if (!bucketer_->armed()) return;
  DS_CHECK(!bucketer_->ready(i), UsageError, "the gradient of parameter #", i,
           " was computed twice in one backward on the accumulation boundary; call "
           "engine.backward() once per micro-batch");
  DS_CHECK(!bucketer_->launched(bucketer_->plan().bucket_of[i]), UsageError,
           "the gradient of parameter #", i, " arrived after its bucket was reduced");
  bucketer_->on_ready(i);
}

void GradReducer::fill(Bucket& b, size_t s, bool ready) {
  const at::Tensor& p = params_[b.params[s]];
  at::Tensor slot = b.flat.narrow(0, b.offsets[s], p.numel());
  // Parameters that got no gradient this backward (unused or frozen by control flow) count as
  // zeros, so every rank reduces the same sizes (Matches DeepSpeed's ZeRO-0 fallback).
  if (ready && p.grad().defined()) {
    slot.copy_(p.grad().reshape({-1}));
  } else {
    slot.zero_();
  }
}

std::vector<comm::Handle> GradReducer::launch(Bucket& b) {
  if (options_.average) {
    // Matches DeepSpeed (reference §7.1): prescale divides by W before the sum; postscale
    // divides by the predivide factor f before and multiplies by f/W after.
    if (options_.prescale) {
      b.flat.mul_(1.0 / world_size_);
    } else if (options_.predivide_factor != 1.0) {
      b.flat.mul_(1.0 / options_.predivide_factor);
    }
  }
  return {comm::all_reduce(b.flat, comm::ReduceOp::kSum, /*async_op=*/true, options_.group)};
}

void GradReducer::complete(Bucket& b) {
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

void GradReducer::finish() {
  if (!bucketer_->armed()) return;
  auto t0 = std::chrono::steady_clock::now();
  bucketer_->flush();
  // Matches DeepSpeed's sparse_allreduce scaling: 1/W, times the predivide factor unless
  // prescale_gradients. After the buckets, in parameter order: the same collectives on every rank.
  const double scale = !options_.average ? 1.0
                       : options_.prescale ? 1.0 / world_size_
                                           : options_.predivide_factor / world_size_;
  last_sparse_rows_ = 0;
  for (auto& p : sparse_params_) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    if (!p.grad().is_contiguous()) p.mutable_grad() = p.grad().contiguous();
    last_sparse_rows_ += all_reduce_rows(p.mutable_grad(), options_.group, scale);
  }
  last_wait_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int64_t GradReducer::bucket_bytes() const {
  int64_t total = 0;
  for (const auto& b : buckets_) total += b.flat.numel() * static_cast<int64_t>(b.flat.element_size());
  return total;
}

}  // namespace deepspeed::runtime

// plan_buckets, GradReadyHooks and Bucketer (see bucketer.h and Note [Static buckets]).
#include "runtime/zero/bucketer.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "util/check.h"

namespace deepspeed::runtime {

BucketPlan plan_buckets(const std::vector<int64_t>& sizes, int64_t limit,
                        const std::vector<int>& keys) {
  DS_INTERNAL_ASSERT(keys.empty() || keys.size() == sizes.size(), "one key per item");
  const size_t n = sizes.size();
  BucketPlan plan;
  plan.bucket_of.assign(n, 0);
  plan.slot_of.assign(n, 0);
  std::vector<size_t> current;
  int64_t current_size = 0;
  auto close = [&] {
    if (current.empty()) return;
    plan.items.push_back(std::move(current));
    current.clear();
    current_size = 0;
  };
  for (size_t k = n; k-- > 0;) {
    const bool other_key = !current.empty() && !keys.empty() && keys[k] != keys[current.back()];
    if (!current.empty() && (current_size + sizes[k] > limit || other_key)) close();
    plan.bucket_of[k] = plan.items.size();
    plan.slot_of[k] = current.size();
    current.push_back(k);
    current_size += sizes[k];
  }
  close();
  return plan;
}

// Fires after AccumulateGrad has written this backward's gradient into param.grad.
class GradReadyHooks::Hook : public torch::autograd::FunctionPostHook {
 public:
  Hook(GradReadyHooks* owner, size_t index) : owner_(owner), index_(index) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    owner_->on_ready_(index_);
    return outputs;
  }
  const GradReadyHooks* owner() const { return owner_; }

 private:
  GradReadyHooks* owner_;
  size_t index_;
};

GradReadyHooks::GradReadyHooks(const std::vector<at::Tensor>& params,
                               std::function<void(size_t)> on_ready)
    : on_ready_(std::move(on_ready)) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    DS_INTERNAL_ASSERT(acc != nullptr, "parameter #", i, " has no gradient accumulator");
    acc->add_post_hook(std::make_unique<Hook>(this, i));
    accumulators_.push_back(std::move(acc));
  }
}

GradReadyHooks::~GradReadyHooks() {
  for (auto& acc : accumulators_) {
    auto& hooks = acc->post_hooks();
    for (auto it = hooks.begin(); it != hooks.end();) {
      auto* h = dynamic_cast<Hook*>(it->get());
      it = (h != nullptr && h->owner() == this) ? hooks.erase(it) : it + 1;
    }
  }
}

Bucketer::Bucketer(BucketPlan plan, BucketerOptions options, BucketOps ops)
    : plan_(std::move(plan)), options_(options), ops_(std::move(ops)) {
  DS_INTERNAL_ASSERT(ops_.fill && ops_.launch && ops_.complete, "Bucketer needs all three ops");
  const size_t buckets = plan_.items.size();
  if (buckets > 0) num_buffers_ = per_bucket() ? buckets : options_.buffers;
  pending_.assign(buckets, 0);
  buffer_of_.assign(buckets, -1);
  handles_.resize(buckets);
  ready_.assign(plan_.bucket_of.size(), false);
  filled_.assign(plan_.bucket_of.size(), false);
  for (size_t i = num_buffers_; !per_bucket() && i-- > 0;) free_.push_back(i);
}

void Bucketer::prepare() {
  DS_INTERNAL_ASSERT(in_flight_.empty(), "a bucket is still in flight from the last backward");
  for (size_t b = 0; b < num_buckets(); ++b) {
    pending_[b] = plan_.items[b].size();
    handles_[b].clear();
    if (per_bucket()) {
      buffer_of_[b] = -1;
    } else {
      DS_INTERNAL_ASSERT(buffer_of_[b] < 0, "a bucket kept its buffer across backward passes");
    }
  }
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(filled_.begin(), filled_.end(), false);
  next_to_launch_ = 0;
  launched_ = launched_from_hooks_ = collectives_ = 0;
  armed_ = true;
}

size_t Bucketer::buffer_for(size_t b) {
  if (buffer_of_[b] >= 0) return static_cast<size_t>(buffer_of_[b]);
  if (per_bucket()) {
    buffer_of_[b] = static_cast<int64_t>(b);
  } else {
    if (free_.empty()) complete_oldest();
    DS_INTERNAL_ASSERT(!free_.empty(), "no reduction buffer came free");
    buffer_of_[b] = static_cast<int64_t>(free_.back());
    free_.pop_back();
  }
  return static_cast<size_t>(buffer_of_[b]);
}

void Bucketer::on_ready(size_t item) {
  if (!armed_) return;
  const size_t b = plan_.bucket_of[item];
  DS_INTERNAL_ASSERT(!ready_[item] && !launched(b), "item ", item, " reported twice or late");
  ready_[item] = true;
  // A pooled buffer is taken only by the bucket being filled (the next to launch), so buckets
  // take buffers in launch order; a bucket's own buffer can take its gradients any time.
  if (options_.fill_on_ready && (per_bucket() || b == next_to_launch_)) {
    ops_.fill(b, plan_.slot_of[item], buffer_for(b), true);
    filled_[item] = true;
  }
  if (--pending_[b] == 0) launch_ready();
}

void Bucketer::launch_ready() {
  while (next_to_launch_ < num_buckets() && pending_[next_to_launch_] == 0) {
    launch(next_to_launch_);
    ++next_to_launch_;
  }
}

void Bucketer::launch(size_t b) {
  const size_t buffer = buffer_for(b);
  const auto& items = plan_.items[b];
  for (size_t slot = 0; slot < items.size(); ++slot) {
    if (filled_[items[slot]]) continue;
    ops_.fill(b, slot, buffer, ready_[items[slot]]);
    filled_[items[slot]] = true;
  }
  handles_[b] = ops_.launch(b, buffer);
  ++launched_;
  if (!flushing_) ++launched_from_hooks_;
  collectives_ += static_cast<int64_t>(handles_[b].size());
  in_flight_.push_back(b);
  if (options_.complete_on_launch) complete_oldest();
}

void Bucketer::complete_oldest() {
  DS_INTERNAL_ASSERT(!in_flight_.empty(), "no reduction in flight");
  const size_t b = in_flight_.front();
  in_flight_.pop_front();
  for (auto& h : handles_[b]) h.wait();
  handles_[b].clear();
  const size_t buffer = static_cast<size_t>(buffer_of_[b]);
  ops_.complete(b, buffer);
  if (!per_bucket()) {
    free_.push_back(buffer);
    buffer_of_[b] = -1;
  }
}

void Bucketer::flush() {
  if (!armed_) return;
  std::fill(pending_.begin(), pending_.end(), 0);  // what is left launches now, in order
  flushing_ = true;
  launch_ready();
  while (!in_flight_.empty()) complete_oldest();
  flushing_ = false;
  armed_ = false;
}

}  // namespace deepspeed::runtime

// plan_buckets and GradReadyHooks (see bucketer.h).
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

}  // namespace deepspeed::runtime

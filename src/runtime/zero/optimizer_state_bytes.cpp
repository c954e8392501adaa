// Bytes held by an optimizer's state, for the memory report. Torch's OptimizerParamState has no
// tensor listing, so the known state types (ours and torch's) are read directly.
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "deepspeed/optimizers.h"
#include "runtime/zero/zero_optimizer.h"

namespace deepspeed::runtime {
namespace {

int64_t bytes(const at::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}

}  // namespace

int64_t optimizer_state_bytes(torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (auto& [key, state] : optimizer.state()) {
    auto* s = state.get();
    if (auto* o = dynamic_cast<optim::ParamState*>(s)) {
      for (const auto& named : o->tensors) total += bytes(named.second);
    } else if (auto* a = dynamic_cast<torch::optim::AdamParamState*>(s)) {
      total += bytes(a->exp_avg()) + bytes(a->exp_avg_sq()) + bytes(a->max_exp_avg_sq());
    } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(s)) {
      total += bytes(w->exp_avg()) + bytes(w->exp_avg_sq()) + bytes(w->max_exp_avg_sq());
    } else if (auto* g = dynamic_cast<torch::optim::SGDParamState*>(s)) {
      total += bytes(g->momentum_buffer());
    } else if (auto* d = dynamic_cast<torch::optim::AdagradParamState*>(s)) {
      total += bytes(d->sum());
    }
  }
  return total;
}

}  // namespace deepspeed::runtime

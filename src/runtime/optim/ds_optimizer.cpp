// DsOptimizer: the step loop, lazy per-parameter state and named per-group hyper-parameters
// shared by Adam, Lamb, Lion, Adagrad and SGD. See Note [Lazy optimizer state].
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/grad_mode.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/state_key.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

const char* kind_name(const GroupOptions::Value& v) {
  if (std::holds_alternative<double>(v)) return "a number";
  if (std::holds_alternative<bool>(v)) return "a flag";
  if (std::holds_alternative<std::string>(v)) return "a text";
  return "a pair";
}

template <typename T>
const T& typed(const GroupOptions::Value* v, const std::string& name, const char* want) {
  DS_CHECK(v != nullptr, Error, "optimizer param group has no hyper-parameter '", name, "'");
  const T* t = std::get_if<T>(v);
  DS_CHECK(t != nullptr, Error, "optimizer hyper-parameter '", name, "' is ", kind_name(*v),
           ", not ", want);
  return *t;
}

}  // namespace

// --- GroupOptions ---------------------------------------------------------------------------

const GroupOptions::Value* GroupOptions::find(const std::string& name) const {
  for (const auto& [k, v] : items_) {
    if (k == name) return &v;
  }
  return nullptr;
}

GroupOptions& GroupOptions::set(const std::string& name, Value value) {
  for (auto& [k, v] : items_) {
    if (k == name) {
      v = std::move(value);
      return *this;
    }
  }
  items_.emplace_back(name, std::move(value));
  return *this;
}

bool GroupOptions::has(const std::string& name) const { return find(name) != nullptr; }

double GroupOptions::number(const std::string& name) const {
  return typed<double>(find(name), name, "a number");
}

bool GroupOptions::flag(const std::string& name) const {
  return typed<bool>(find(name), name, "a flag");
}

std::pair<double, double> GroupOptions::pair(const std::string& name) const {
  return typed<std::pair<double, double>>(find(name), name, "a pair");
}

const std::string& GroupOptions::text(const std::string& name) const {
  return typed<std::string>(find(name), name, "a text");
}

// --- ParamState -----------------------------------------------------------------------------

at::Tensor& ParamState::tensor(const std::string& name) {
  for (auto& [k, t] : tensors) {
    if (k == name) return t;
  }
  throw Error("optimizer state has no tensor '" + name + "'");
}

// --- DsOptimizer ----------------------------------------------------------------------------

DsOptimizer::DsOptimizer(std::vector<torch::optim::OptimizerParamGroup> groups,
                         GroupOptions defaults)
    : torch::optim::Optimizer(std::move(groups), std::make_unique<GroupOptions>(defaults)) {
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    auto* options = dynamic_cast<GroupOptions*>(&param_groups_[g].options());
    DS_CHECK(options != nullptr, UsageError, "param group ", g,
             " of a deepspeed optimizer has options of another optimizer type; give "
             "deepspeed::optim::GroupOptions or none (the defaults are used)");
    for (const auto& [name, value] : defaults.items()) {
      if (!options->has(name)) std::visit([&](auto v) { options->set(name, v); }, value);
    }
  }
}

GroupOptions& DsOptimizer::group_options(size_t index) {
  DS_INTERNAL_ASSERT(index < param_groups_.size());
  return static_cast<GroupOptions&>(param_groups_[index].options());
}

ParamState* DsOptimizer::find_state(const at::Tensor& param) {
  auto it = state_.find(detail::state_key(param));
  return it == state_.end() ? nullptr : static_cast<ParamState*>(it->second.get());
}

at::Tensor DsOptimizer::initial_state(const std::string& name, const at::Tensor& param,
                                      const GroupOptions& group) const {
  return at::zeros_like(param, at::MemoryFormat::Contiguous);
}

ParamState& DsOptimizer::get_or_create_state(const at::Tensor& param, const GroupOptions& group) {
  auto key = detail::state_key(param);
  auto it = state_.find(key);
  if (it != state_.end()) return static_cast<ParamState&>(*it->second);
  auto state = std::make_unique<ParamState>();
  for (const auto& name : state_names(group)) {
    state->tensors.emplace_back(name, initial_state(name, param.detach(), group));
  }
  ParamState& ref = *state;
  state_[key] = std::move(state);
  return ref;
}

at::Tensor DsOptimizer::step(LossClosure closure) {
  at::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable_grad(true);
    loss = closure();
  }
  torch::NoGradGuard no_grad;
  copy_outs_written_.clear();
  begin_step();
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const GroupOptions& group = group_options(g);
    std::vector<ParamUpdate> updates;
    std::vector<const void*> keys;  // copy-out identity of updates[i]'s parameter
    for (const at::Tensor& p : param_groups_[g].params()) {
      if (!p.grad().defined()) continue;
      DS_CHECK(!p.grad().is_sparse(), NotSupportedError, type_name(),
               " does not support sparse gradients");
      ParamState& state = get_or_create_state(p, group);
      ++state.step;
      const void* key = p.unsafeGetTensorImpl();
      auto copy_out = copy_outs_.find(key);
      updates.push_back(ParamUpdate{p.detach(), p.grad().detach(), state,
                                    copy_out == copy_outs_.end() ? at::Tensor() : copy_out->second});
      keys.push_back(key);
      if (grad_scale_ != 1.0) {
        ParamUpdate& u = updates.back();
        if (applies_grad_scale(u)) {
          u.grad_scale = grad_scale_;
        } else {
          u.grad.mul_(grad_scale_);
        }
      }
    }
    if (updates.empty()) continue;
    update_group(updates, group);
    for (size_t i = 0; i < updates.size(); ++i) {
      if (updates[i].wrote_copy_out) copy_outs_written_.insert(keys[i]);
    }
  }
  return loss;
}

void DsOptimizer::update_group(std::vector<ParamUpdate>& params, const GroupOptions& group) {
  for (ParamUpdate& u : params) update(u.param, u.grad, u.state, group);
}

// --- fused copy-out (Note [Fused copy-out]) -------------------------------------------------

void DsOptimizer::set_copy_out(const at::Tensor& master, at::Tensor half_dst) {
  DS_CHECK(master.defined(), UsageError, type_name(), ".set_copy_out: the master is undefined");
  const void* key = master.unsafeGetTensorImpl();
  if (!half_dst.defined()) {
    copy_outs_.erase(key);
    copy_outs_written_.erase(key);
    return;
  }
  DS_CHECK(half_dst.scalar_type() == at::kBFloat16 || half_dst.scalar_type() == at::kHalf,
           UsageError, type_name(), ".set_copy_out: the destination is ",
           half_dst.scalar_type(), "; expected bf16 or fp16 (the model partition's dtype)");
  DS_CHECK(half_dst.numel() == master.numel(), UsageError, type_name(),
           ".set_copy_out: the destination has ", half_dst.numel(), " elements, the master ",
           master.numel(), "; expected the same partition");
  DS_CHECK(half_dst.is_contiguous(), UsageError, type_name(),
           ".set_copy_out: the destination must be contiguous (a flat partition)");
  copy_outs_[key] = std::move(half_dst);
}

bool DsOptimizer::wrote_copy_out(const at::Tensor& master) const {
  return master.defined() && copy_outs_written_.count(master.unsafeGetTensorImpl()) > 0;
}

// --- betas of any optimizer -----------------------------------------------------------------

std::optional<std::pair<double, double>> get_betas(const torch::optim::OptimizerOptions& options) {
  if (auto* o = dynamic_cast<const GroupOptions*>(&options)) {
    if (o->has("betas")) return o->pair("betas");
    return std::nullopt;
  }
  if (auto* o = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    return std::make_pair(std::get<0>(o->betas()), std::get<1>(o->betas()));
  }
  if (auto* o = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    return std::make_pair(std::get<0>(o->betas()), std::get<1>(o->betas()));
  }
  return std::nullopt;
}

bool set_betas(torch::optim::OptimizerOptions& options, double beta1, double beta2) {
  if (auto* o = dynamic_cast<GroupOptions*>(&options)) {
    if (!o->has("betas")) return false;
    o->set("betas", std::make_pair(beta1, beta2));
    return true;
  }
  if (auto* o = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    o->betas({beta1, beta2});
    return true;
  }
  if (auto* o = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    o->betas({beta1, beta2});
    return true;
  }
  return false;
}

}  // namespace deepspeed::optim

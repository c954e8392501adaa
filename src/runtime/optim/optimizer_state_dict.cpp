// Optimizer state in Python's torch.optim layout, for our optimizers and torch::optim's Adam,
// AdamW, SGD and Adagrad: the part of a DeepSpeed checkpoint that Python reads back.
// Matches torch.optim.Optimizer.load_state_dict: saved params map to the optimizer's by position
// within each group, saved groups replace the hyper-parameters, and state replaces state.
#include <cmath>
#include <functional>
#include <map>
#include <typeinfo>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/List.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "deepspeed/optimizers.h"
#include "runtime/optim/state_key.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

using c10::IValue;
using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

Dict string_dict() { return Dict(c10::StringType::get(), c10::AnyType::get()); }
// Plain pickled lists: typed int lists would pickle through torch.jit._pickle.build_intlist,
// which torch.load(weights_only=True) refuses.
List any_list() { return List(c10::AnyType::get()); }

IValue pair_value(double a, double b) { return c10::ivalue::Tuple::create({IValue(a), IValue(b)}); }

// --- reading values back --------------------------------------------------------------------

const IValue* lookup(const Dict& d, const std::string& key) {
  for (const auto& entry : d) {
    if (entry.key().isString() && entry.key().toStringRef() == key) return &entry.value();
  }
  return nullptr;
}

Dict as_dict(const IValue& v, const std::string& where) {
  DS_CHECK(v.isGenericDict(), CheckpointError, "optimizer state dict: ", where, " is a ",
           v.tagKind(), ", expected a dict");
  return v.toGenericDict();
}

const IValue& require(const Dict& d, const std::string& key, const std::string& where) {
  const IValue* v = lookup(d, key);
  DS_CHECK(v != nullptr, CheckpointError, "optimizer state dict: ", where, " has no '", key, "'");
  return *v;
}

double as_number(const IValue& v, const std::string& where) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isTensor() && v.toTensor().numel() == 1) return v.toTensor().item<double>();
  throw CheckpointError("optimizer state dict: " + where + " is a " + v.tagKind() +
                        ", expected a number");
}

bool as_flag(const IValue& v, const std::string& where) {
  DS_CHECK(v.isBool(), CheckpointError, "optimizer state dict: ", where, " is a ", v.tagKind(),
           ", expected true or false");
  return v.toBool();
}

std::pair<double, double> as_pair(const IValue& v, const std::string& where) {
  std::vector<IValue> items;
  if (v.isTuple()) {
    auto elems = v.toTupleRef().elements();
    items.assign(elems.begin(), elems.end());
  } else if (v.isList()) {
    auto elems = v.toListRef();
    items.assign(elems.begin(), elems.end());
  }
  DS_CHECK(items.size() == 2, CheckpointError, "optimizer state dict: ", where,
           " is not a pair of numbers");
  return {as_number(items[0], where + "[0]"), as_number(items[1], where + "[1]")};
}

std::string as_text(const IValue& v, const std::string& where) {
  DS_CHECK(v.isString(), CheckpointError, "optimizer state dict: ", where, " is a ", v.tagKind(),
           ", expected a string");
  return v.toStringRef();
}

int64_t as_step(const IValue& v, const std::string& where) {
  return static_cast<int64_t>(std::llround(as_number(v, where)));
}

// A saved state tensor as the state of `param`: the shape of `like` (the state's initial value,
// which is the parameter's shape except for buffers such as the 1-bit optimizers' padded error
// feedback), the parameter's dtype and device, and a copy, so that later updates never write
// into the caller's dict.
at::Tensor as_state_tensor(const IValue& v, const at::Tensor& param, const at::Tensor& like,
                           const std::string& where) {
  DS_CHECK(v.isTensor(), CheckpointError, "optimizer state dict: ", where, " is a ", v.tagKind(),
           ", expected a tensor");
  const at::Tensor& t = v.toTensor();
  const at::Tensor& shape_of = like.defined() ? like : param;
  DS_CHECK(t.sizes() == shape_of.sizes(), CheckpointError, "optimizer state dict: ", where,
           " has shape ", t.sizes(), " but ",
           shape_of.sizes() == param.sizes() ? "its parameter" : "this optimizer's state",
           " has shape ", shape_of.sizes(),
           "; was the checkpoint written by another model or data-parallel layout?");
  // The dtype of the state it replaces: Adam keeps fp32 moments of 16-bit parameters when
  // asked (fp32_optimizer_states).
  const auto dtype = like.defined() ? like.scalar_type() : param.scalar_type();
  return t.to(param.options().dtype(dtype), /*non_blocking=*/false, /*copy=*/true,
              at::MemoryFormat::Contiguous);
}

at::Tensor as_state_tensor(const IValue& v, const at::Tensor& param, const std::string& where) {
  return as_state_tensor(v, param, at::Tensor(), where);
}

// --- one adapter per optimizer family -------------------------------------------------------

// What differs between optimizer classes; the layout logic below is shared.
struct Family {
  std::function<Dict(const torch::optim::OptimizerOptions&)> save_group;
  std::function<void(torch::optim::OptimizerOptions&, const Dict&, const std::string&)> load_group;
  // The saved state of `param`, or nullopt when it has none.
  std::function<std::optional<Dict>(const at::Tensor& param,
                                    const torch::optim::OptimizerOptions& options)>
      save_state;
  // Loads the state of `param`, whose group will have `options` (already loaded).
  std::function<void(const at::Tensor& param, const torch::optim::OptimizerOptions& options,
                     const Dict&, const std::string&)>
      load_state;
  // Whether state absent from the dict is dropped (Python) or kept (torch Adagrad, whose step()
  // requires state for every parameter).
  bool clear_state_before_load = true;
};

Family ds_family(DsOptimizer& opt) {
  Family f;
  f.save_group = [](const torch::optim::OptimizerOptions& o) {
    Dict d = string_dict();
    for (const auto& [name, value] : static_cast<const GroupOptions&>(o).items()) {
      if (auto* x = std::get_if<double>(&value)) d.insert(name, *x);
      if (auto* b = std::get_if<bool>(&value)) d.insert(name, *b);
      if (auto* p = std::get_if<std::pair<double, double>>(&value)) {
        d.insert(name, pair_value(p->first, p->second));
      }
      if (auto* t = std::get_if<std::string>(&value)) d.insert(name, *t);
    }
    return d;
  };
  f.load_group = [](torch::optim::OptimizerOptions& o, const Dict& saved, const std::string& at) {
    auto& options = static_cast<GroupOptions&>(o);
    const auto items = options.items();  // a copy: set() below writes into the same vector
    for (const auto& [name, value] : items) {
      const IValue* v = lookup(saved, name);
      if (v == nullptr) continue;  // keep ours; Python's groups may lack keys we added
      const std::string where = at + "." + name;
      if (std::holds_alternative<double>(value)) options.set(name, as_number(*v, where));
      if (std::holds_alternative<bool>(value)) options.set(name, as_flag(*v, where));
      if (std::holds_alternative<std::pair<double, double>>(value)) {
        options.set(name, as_pair(*v, where));
      }
      if (std::holds_alternative<std::string>(value)) options.set(name, as_text(*v, where));
    }
  };
  f.save_state = [&opt](const at::Tensor& p,
                        const torch::optim::OptimizerOptions& options) -> std::optional<Dict> {
    ParamState* s = opt.find_state(p);
    if (s == nullptr) return std::nullopt;
    Dict d = string_dict();
    if (opt.counts_steps(static_cast<const GroupOptions&>(options))) d.insert("step", s->step);
    for (const auto& [name, t] : s->tensors) {
      if (t.defined()) d.insert(name, t);
    }
    if (d.size() == 0) return std::nullopt;  // SGD without momentum: Python keeps no state
    return d;
  };
  f.load_state = [&opt](const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                        const Dict& saved, const std::string& at) {
    const auto& group = static_cast<const GroupOptions&>(options);
    ParamState& s = opt.get_or_create_state(p, group);
    if (opt.counts_steps(group)) s.step = as_step(require(saved, "step", at), at + ".step");
    for (auto& [name, t] : s.tensors) {
      if (const IValue* v = lookup(saved, name)) {
        t = as_state_tensor(*v, p, t, at + "." + name);
      } else {
        DS_CHECK(!t.defined(), CheckpointError, "optimizer state dict: ", at, " has no '", name,
                 "', which ", opt.type_name(), " needs");
      }
    }
  };
  return f;
}

template <typename Options, typename State>
Family torch_adam_family(torch::optim::Optimizer& opt) {
  Family f;
  f.save_group = [](const torch::optim::OptimizerOptions& base) {
    const auto& o = static_cast<const Options&>(base);
    Dict d = string_dict();
    d.insert("lr", o.lr());
    d.insert("betas", pair_value(std::get<0>(o.betas()), std::get<1>(o.betas())));
    d.insert("eps", o.eps());
    d.insert("weight_decay", o.weight_decay());
    d.insert("amsgrad", o.amsgrad());
    return d;
  };
  f.load_group = [](torch::optim::OptimizerOptions& base, const Dict& saved,
                    const std::string& at) {
    auto& o = static_cast<Options&>(base);
    if (auto* v = lookup(saved, "lr")) o.lr(as_number(*v, at + ".lr"));
    if (auto* v = lookup(saved, "betas")) {
      auto [b1, b2] = as_pair(*v, at + ".betas");
      o.betas({b1, b2});
    }
    if (auto* v = lookup(saved, "eps")) o.eps(as_number(*v, at + ".eps"));
    if (auto* v = lookup(saved, "weight_decay")) {
      o.weight_decay(as_number(*v, at + ".weight_decay"));
    }
    if (auto* v = lookup(saved, "amsgrad")) o.amsgrad(as_flag(*v, at + ".amsgrad"));
  };
  f.save_state = [&opt](const at::Tensor& p,
                        const torch::optim::OptimizerOptions&) -> std::optional<Dict> {
    auto it = opt.state().find(detail::state_key(p));
    if (it == opt.state().end()) return std::nullopt;
    const auto& s = static_cast<const State&>(*it->second);
    Dict d = string_dict();
    // PyTorch keeps Adam's step as a float32 scalar tensor.
    d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
    d.insert("exp_avg", s.exp_avg());
    d.insert("exp_avg_sq", s.exp_avg_sq());
    if (s.max_exp_avg_sq().defined()) d.insert("max_exp_avg_sq", s.max_exp_avg_sq());
    return d;
  };
  f.load_state = [&opt](const at::Tensor& p, const torch::optim::OptimizerOptions& options,
                        const Dict& saved, const std::string& at) {
    auto s = std::make_unique<State>();
    s->step(as_step(require(saved, "step", at), at + ".step"));
    s->exp_avg(as_state_tensor(require(saved, "exp_avg", at), p, at + ".exp_avg"));
    s->exp_avg_sq(as_state_tensor(require(saved, "exp_avg_sq", at), p, at + ".exp_avg_sq"));
    if (static_cast<const Options&>(options).amsgrad()) {
      s->max_exp_avg_sq(
          as_state_tensor(require(saved, "max_exp_avg_sq", at), p, at + ".max_exp_avg_sq"));
    }
    opt.state()[detail::state_key(p)] = std::move(s);
  };
  return f;
}

Family torch_sgd_family(torch::optim::Optimizer& opt) {
  using torch::optim::SGDOptions;
  Family f;
  f.save_group = [](const torch::optim::OptimizerOptions& base) {
    const auto& o = static_cast<const SGDOptions&>(base);
    Dict d = string_dict();
    d.insert("lr", o.lr());
    d.insert("momentum", o.momentum());
    d.insert("dampening", o.dampening());
    d.insert("weight_decay", o.weight_decay());
    d.insert("nesterov", o.nesterov());
    return d;
  };
  f.load_group = [](torch::optim::OptimizerOptions& base, const Dict& saved,
                    const std::string& at) {
    auto& o = static_cast<SGDOptions&>(base);
    if (auto* v = lookup(saved, "lr")) o.lr(as_number(*v, at + ".lr"));
    if (auto* v = lookup(saved, "momentum")) o.momentum(as_number(*v, at + ".momentum"));
    if (auto* v = lookup(saved, "dampening")) o.dampening(as_number(*v, at + ".dampening"));
    if (auto* v = lookup(saved, "weight_decay")) {
      o.weight_decay(as_number(*v, at + ".weight_decay"));
    }
    if (auto* v = lookup(saved, "nesterov")) o.nesterov(as_flag(*v, at + ".nesterov"));
  };
  f.save_state = [&opt](const at::Tensor& p,
                        const torch::optim::OptimizerOptions&) -> std::optional<Dict> {
    auto it = opt.state().find(detail::state_key(p));
    if (it == opt.state().end()) return std::nullopt;
    const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (!s.momentum_buffer().defined()) return std::nullopt;
    Dict d = string_dict();
    d.insert("momentum_buffer", s.momentum_buffer());
    return d;
  };
  f.load_state = [&opt](const at::Tensor& p, const torch::optim::OptimizerOptions&,
                        const Dict& saved, const std::string& at) {
    const IValue* v = lookup(saved, "momentum_buffer");
    if (v == nullptr || v->isNone()) return;  // Python writes None for momentum 0
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(as_state_tensor(*v, p, at + ".momentum_buffer"));
    opt.state()[detail::state_key(p)] = std::move(s);
  };
  return f;
}

Family torch_adagrad_family(torch::optim::Optimizer& opt) {
  using torch::optim::AdagradOptions;
  Family f;
  f.clear_state_before_load = false;
  f.save_group = [](const torch::optim::OptimizerOptions& base) {
    const auto& o = static_cast<const AdagradOptions&>(base);
    Dict d = string_dict();
    d.insert("lr", o.lr());
    d.insert("lr_decay", o.lr_decay());
    d.insert("eps", o.eps());
    d.insert("weight_decay", o.weight_decay());
    d.insert("initial_accumulator_value", o.initial_accumulator_value());
    return d;
  };
  f.load_group = [](torch::optim::OptimizerOptions& base, const Dict& saved,
                    const std::string& at) {
    auto& o = static_cast<AdagradOptions&>(base);
    if (auto* v = lookup(saved, "lr")) o.lr(as_number(*v, at + ".lr"));
    if (auto* v = lookup(saved, "lr_decay")) o.lr_decay(as_number(*v, at + ".lr_decay"));
    if (auto* v = lookup(saved, "eps")) o.eps(as_number(*v, at + ".eps"));
    if (auto* v = lookup(saved, "weight_decay")) {
      o.weight_decay(as_number(*v, at + ".weight_decay"));
    }
    if (auto* v = lookup(saved, "initial_accumulator_value")) {
      o.initial_accumulator_value(as_number(*v, at + ".initial_accumulator_value"));
    }
  };
  f.save_state = [&opt](const at::Tensor& p,
                        const torch::optim::OptimizerOptions&) -> std::optional<Dict> {
    auto it = opt.state().find(detail::state_key(p));
    if (it == opt.state().end()) return std::nullopt;
    const auto& s = static_cast<const torch::optim::AdagradParamState&>(*it->second);
    Dict d = string_dict();
    d.insert("step", at::scalar_tensor(static_cast<double>(s.step()), at::kFloat));
    d.insert("sum", s.sum());
    return d;
  };
  f.load_state = [&opt](const at::Tensor& p, const torch::optim::OptimizerOptions&,
                        const Dict& saved, const std::string& at) {
    auto s = std::make_unique<torch::optim::AdagradParamState>();
    s->step(as_step(require(saved, "step", at), at + ".step"));
    s->sum(as_state_tensor(require(saved, "sum", at), p, at + ".sum"));
    opt.state()[detail::state_key(p)] = std::move(s);
  };
  return f;
}

Family family_of(torch::optim::Optimizer& opt) {
  if (auto* ds = dynamic_cast<DsOptimizer*>(&opt)) return ds_family(*ds);
  // AdamW first: neither derives from the other, but keep the checks exact.
  if (dynamic_cast<torch::optim::AdamW*>(&opt) != nullptr) {
    return torch_adam_family<torch::optim::AdamWOptions, torch::optim::AdamWParamState>(opt);
  }
  if (dynamic_cast<torch::optim::Adam*>(&opt) != nullptr) {
    return torch_adam_family<torch::optim::AdamOptions, torch::optim::AdamParamState>(opt);
  }
  if (dynamic_cast<torch::optim::SGD*>(&opt) != nullptr) return torch_sgd_family(opt);
  if (dynamic_cast<torch::optim::Adagrad*>(&opt) != nullptr) return torch_adagrad_family(opt);
  throw NotSupportedError(
      std::string("optimizer state dicts are supported for deepspeed::optim optimizers and "
                  "torch::optim Adam, AdamW, SGD and Adagrad, not for ") +
      typeid(opt).name());
}

}  // namespace

IValue optimizer_state_dict(torch::optim::Optimizer& optimizer) {
  Family family = family_of(optimizer);
  Dict state(c10::IntType::get(), c10::AnyType::get());
  List groups = any_list();
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    Dict g = family.save_group(group.options());
    List ids = any_list();
    for (const auto& p : group.params()) {
      if (auto s = family.save_state(p, group.options())) state.insert(index, *s);
      ids.push_back(index++);
    }
    g.insert("params", ids);
    groups.push_back(g);
  }
  Dict out = string_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return out;
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const IValue& state_dict) {
  Family family = family_of(optimizer);
  Dict top = as_dict(state_dict, "the top level");
  const IValue& groups_value = require(top, "param_groups", "the top level");
  DS_CHECK(groups_value.isList(), CheckpointError,
           "optimizer state dict: param_groups is not a list");
  auto saved_groups = groups_value.toListRef();
  auto& groups = optimizer.param_groups();
  DS_CHECK(saved_groups.size() == groups.size(), CheckpointError,
           "optimizer state dict has ", saved_groups.size(), " param groups, the optimizer has ",
           groups.size(), "; the model or its param groups differ from the checkpoint's");

  // Saved parameter id -> (group, parameter), by position within each group (as PyTorch does).
  std::map<int64_t, std::pair<size_t, const at::Tensor*>> by_id;
  std::vector<Dict> saved_group_dicts;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string at = "param_groups[" + std::to_string(g) + "]";
    Dict saved = as_dict(saved_groups[g], at);
    const IValue& ids_value = require(saved, "params", at);
    DS_CHECK(ids_value.isList(), CheckpointError, "optimizer state dict: ", at,
             ".params is not a list");
    auto ids = ids_value.toListRef();
    DS_CHECK(ids.size() == groups[g].params().size(), CheckpointError,
             "optimizer state dict: param group ", g, " has ", ids.size(),
             " parameters, the optimizer's has ", groups[g].params().size(),
             "; the model or its param groups differ from the checkpoint's");
    for (size_t i = 0; i < ids.size(); ++i) {
      DS_CHECK(ids[i].isInt(), CheckpointError, "optimizer state dict: ", at, ".params[", i,
               "] is not an integer");
      by_id[ids[i].toInt()] = {g, &groups[g].params()[i]};
    }
    saved_group_dicts.push_back(saved);
  }
  const IValue& state_value = require(top, "state", "the top level");
  Dict saved_state = as_dict(state_value, "state");

  // Everything is read into copies first, so that a failed load leaves the optimizer as it was.
  for (const auto& entry : saved_state) {
    DS_CHECK(entry.key().isInt(), CheckpointError,
             "optimizer state dict: a state key is not a parameter index");
    DS_CHECK(by_id.count(entry.key().toInt()) == 1, CheckpointError,
             "optimizer state dict: state[", entry.key().toInt(),
             "] belongs to no parameter listed in param_groups");
    as_dict(entry.value(), "state[" + std::to_string(entry.key().toInt()) + "]");
  }
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> new_options;
  for (size_t g = 0; g < groups.size(); ++g) {
    new_options.push_back(groups[g].options().clone());
    family.load_group(*new_options.back(), saved_group_dicts[g],
                      "param_groups[" + std::to_string(g) + "]");
  }
  auto old_state = std::move(optimizer.state());
  optimizer.state() = {};
  if (!family.clear_state_before_load) {
    for (const auto& [key, value] : old_state) optimizer.state()[key] = value->clone();
  }
  try {
    for (const auto& entry : saved_state) {
      const int64_t id = entry.key().toInt();
      auto [g, param] = by_id.at(id);
      family.load_state(*param, *new_options[g], entry.value().toGenericDict(),
                        "state[" + std::to_string(id) + "]");
    }
  } catch (...) {
    optimizer.state() = std::move(old_state);
    throw;
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(new_options[g]));
}

}  // namespace deepspeed::optim

// ds_to_universal's reader for ZeRO-0 checkpoints (see universal_source.h). Stage 0 keeps the
// whole optimizer in the model states' 'optimizer':
//  - fp32: the optimizer's own state dict, one state per parameter (its index in the groups);
//  - fp16/bf16: FP16_Optimizer's dict, one flat fp32 master per param group
//    (fp32_groups_flat) and the inner optimizer's state over each flat; or (DeepSpeed with an
//    unfused optimizer) FP16_UnfusedOptimizer's, an fp32 master per parameter (fp32_groups).
// Which parameter is which comes from param_shapes (per group, in order), which deepspeed-cpp
// writes at stage 0 too. DeepSpeed writes None there; then a single param group is taken to
// hold the module's parameters in order, and the sizes must agree.
#include "runtime/checkpoint/universal_source.h"

#include <set>
#include <sstream>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/errors.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::checkpoint::detail {
namespace {

using c10::IValue;

// The module's trainable parameters as the optimizer's groups list them: param_shapes, or
// (DeepSpeed's files) every module entry but buffers and tied aliases as one group.
std::vector<ShapeDict> optimizer_groups(const ModelStates& states, size_t saved_groups,
                                        const std::string& path) {
  if (states.param_shapes) {
    DS_CHECK(states.param_shapes->size() == saved_groups, CheckpointError, path,
             ": param_shapes lists ", states.param_shapes->size(),
             " param groups, the optimizer has ", saved_groups);
    return *states.param_shapes;
  }
  DS_CHECK(saved_groups == 1, CheckpointError, path, ": has no param_shapes (DeepSpeed writes "
           "None at ZeRO stage 0) and its optimizer has ", saved_groups, " param groups, so "
           "which parameter each group holds is not recorded; ds_to_universal converts such a "
           "checkpoint only with one param group");
  std::set<std::string> skip(states.buffer_names.begin(), states.buffer_names.end());
  for (const auto& [alias, source] : states.shared_params.value_or(
           std::vector<std::pair<std::string, std::string>>{})) {
    skip.insert(alias);
  }
  ShapeDict all;
  for (const auto& item : states.module) {
    if (!skip.count(item.key())) all.insert(item.key(), item.value().sizes().vec());
  }
  return {all};
}

int64_t total_numel(const ShapeDict& shapes) {
  int64_t n = 0;
  for (const auto& item : shapes) n += c10::multiply_integers(item.value());
  return n;
}

// A group's sizes must match what the optimizer holds: a frozen or tied parameter in a
// checkpoint without param_shapes would shift every parameter after it.
void check_group(bool matches, const ModelStates& states, size_t g, const std::string& what,
                 const std::string& path) {
  DS_CHECK(matches, CheckpointError, path, ": param group ", g, " of the optimizer holds ", what,
           states.param_shapes ? " (param_shapes and the optimizer disagree)"
                               : "; without param_shapes (a DeepSpeed stage-0 file) the module's "
                                 "parameters must be the group's, in order (a frozen or tied "
                                 "parameter?)");
}

// fp16/bf16: FP16_Optimizer's fp32_groups_flat and the inner optimizer's state over each flat.
void read_flat_masters(const DictReader& fp16, const ModelStates& states, const std::string& path,
                       UniversalSource* out) {
  const auto flats = as_sequence(fp16.at("fp32_groups_flat"), fp16.where("fp32_groups_flat"));
  DictReader inner(fp16.at("optimizer_state_dict"), fp16.where("optimizer_state_dict"));
  const Dict state = inner.at("state").toGenericDict();
  const auto groups = optimizer_groups(states, flats.size(), path);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = fp16.where("fp32_groups_flat") + "[" + std::to_string(g) + "]";
    const at::Tensor flat = as_tensor(flats[g], where).reshape(-1);
    const int64_t numel = total_numel(groups[g]);
    check_group(states.param_shapes ? flat.numel() >= numel : flat.numel() == numel, states, g,
                std::to_string(flat.numel()) + " elements, its parameters " +
                    std::to_string(numel),
                path);
    for (const auto& item : groups[g]) out->order.push_back(item.key());
    runtime::split_saved_group(flat.narrow(0, 0, numel), groups[g], path, &out->states["fp32"]);
    const IValue key(static_cast<int64_t>(g));
    if (!state.contains(key)) continue;  // saved before the first step
    for (const auto& e : state.at(key).toGenericDict()) {
      const std::string name = e.key().toStringRef();
      const IValue& v = e.value();
      if (name == "step") {
        const at::Tensor step = as_step_tensor(v, inner.where("state") + "[" +
                                                      std::to_string(g) + "]");
        for (const auto& item : groups[g]) out->step[item.key()] = step;
      } else if (v.isTensor() && v.toTensor().dim() == 1 && v.toTensor().numel() >= numel) {
        runtime::split_saved_group(v.toTensor().narrow(0, 0, numel), groups[g], path,
                                   &out->states[name]);
      }
    }
  }
}

// The optimizer's state dict over the parameters themselves, one state per parameter. The
// masters are the module's weights (fp32), or `fp32_groups` (FP16_UnfusedOptimizer: per group,
// one fp32 copy per parameter).
void read_parameter_states(const DictReader& optimizer, const ModelStates& states,
                           const std::string& path, UniversalSource* out,
                           const std::vector<std::vector<c10::IValue>>* fp32_groups = nullptr) {
  const auto saved_groups =
      as_sequence(optimizer.at("param_groups"), optimizer.where("param_groups"));
  DS_CHECK(!fp32_groups || fp32_groups->size() == saved_groups.size(), CheckpointError, path,
           ": ", fp32_groups ? fp32_groups->size() : 0, " fp32_groups, ", saved_groups.size(),
           " param groups");
  const Dict state = optimizer.at("state").toGenericDict();
  const auto groups = optimizer_groups(states, saved_groups.size(), path);
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = optimizer.where("param_groups") + "[" + std::to_string(g) + "]";
    DictReader group(saved_groups[g], where);
    const auto indices = as_sequence(group.at("params"), group.where("params"));
    check_group(indices.size() == groups[g].size(), states, g,
                std::to_string(indices.size()) + " parameters, the module " +
                    std::to_string(groups[g].size()),
                path);
    size_t j = 0;
    for (const auto& item : groups[g]) {
      const std::string& name = item.key();
      const at::Tensor* weight = states.module.find(name);
      DS_CHECK(weight != nullptr, CheckpointError, path, ": the module has no parameter '", name,
               "' that param_shapes lists");
      const Shape& shape = item.value();
      DS_CHECK(weight->sizes().vec() == shape, CheckpointError, path, ": parameter '", name,
               "' has shape ", weight->sizes(), " in the module, ", at::IntArrayRef(shape),
               " in param_shapes");
      at::Tensor master = weight->to(at::kFloat);
      if (fp32_groups) {
        const auto& group_masters = (*fp32_groups)[g];
        DS_CHECK(j < group_masters.size(), CheckpointError, path, ": fp32_groups[", g, "] has ",
                 group_masters.size(), " tensors, the group ", indices.size(), " parameters");
        master = as_tensor(group_masters[j], path + ": fp32_groups[" + std::to_string(g) + "]");
        DS_CHECK(master.numel() == weight->numel(), CheckpointError, path, ": fp32_groups[", g,
                 "][", j, "] has ", master.numel(), " elements, parameter '", name, "' ",
                 weight->numel());
      }
      out->order.push_back(name);
      out->states["fp32"][name] = runtime::SavedParam{master.reshape(-1), shape};
      const IValue index = indices[j++];
      if (!state.contains(index)) continue;  // saved before the first step
      const int64_t numel = weight->numel();
      for (const auto& e : state.at(index).toGenericDict()) {
        const std::string key = e.key().toStringRef();
        const IValue& v = e.value();
        if (key == "step") {
          out->step[name] = as_step_tensor(v, optimizer.where("state") + "[" + name + "]");
        } else if (v.isTensor() && v.toTensor().numel() == numel) {
          out->states[key][name] =
              runtime::SavedParam{v.toTensor().to(at::kFloat).reshape(-1), shape};
        }
      }
    }
  }
}

// The loss scaler of a 16-bit stage-0 file: ours (the 'loss_scaler' dict, every attribute) or
// FP16_Optimizer's own keys, in the module's dtype.
LossScalerState loss_scaler_of(const DictReader& fp16, const ModelStates& states) {
  LossScalerState s;
  if (fp16.has_value("loss_scaler")) {
    s = LossScalerState::from_ivalue(fp16.at("loss_scaler"), fp16.where("loss_scaler"));
  } else {
    s.dynamic = fp16.has_value("dynamic_loss_scale") && fp16.get_bool("dynamic_loss_scale");
    if (fp16.has_value("cur_scale")) s.cur_scale = fp16.get_double("cur_scale");
    if (fp16.has_value("cur_iter")) s.cur_iter = fp16.get_int("cur_iter");
    if (s.dynamic) {
      s.last_overflow_iter = fp16.get_int("last_overflow_iter");
      s.scale_factor = fp16.get_double("scale_factor");
      s.scale_window = fp16.get_int("scale_window");
    }
  }
  for (const auto& item : states.module) {
    if (item.value().is_floating_point()) {
      s.dtype = item.value().scalar_type();
      break;
    }
  }
  return s;
}

}  // namespace

UniversalSource read_zero0_source(const IValue& model_states, const std::string& path) {
  const ModelStates states = ModelStates::from_ivalue(model_states, path);
  UniversalSource out;
  Dict model = model_states.toGenericDict().copy();
  // The output's model states leave the optimizer to the zero/ folder.
  model.insert_or_assign("optimizer", IValue());
  out.model_states = model;

  DictReader optimizer(states.optimizer, path + ": optimizer");
  // DeepSpeed's global state: what the file's optimizer holds besides the per-parameter
  // parts, in the shape of a ZeRO file's optimizer_state_dict.
  Dict global = new_dict();
  Dict raw = new_dict();
  if (optimizer.has("fp32_groups_flat")) {
    read_flat_masters(optimizer, states, path, &out);
    for (const auto& e : optimizer.dict()) {
      if (!(e.key().isString() && e.key().toStringRef() == "fp32_groups_flat")) {
        global.insert(e.key(), e.value());
      }
    }
    global.insert_or_assign("loss_scaler",
                            loss_scaler_of(optimizer, states).to_ivalue(/*as_object=*/false));
  } else if (optimizer.has("fp32_groups")) {  // DeepSpeed's FP16_UnfusedOptimizer
    std::vector<std::vector<IValue>> masters;
    for (const auto& g : as_sequence(optimizer.at("fp32_groups"), optimizer.where("fp32_groups"))) {
      masters.push_back(as_sequence(g, optimizer.where("fp32_groups")));
    }
    DictReader inner(optimizer.at("optimizer_state_dict"), optimizer.where("optimizer_state_dict"));
    read_parameter_states(inner, states, path, &out, &masters);
    for (const auto& e : optimizer.dict()) {
      if (!(e.key().isString() && e.key().toStringRef() == "fp32_groups")) {
        global.insert(e.key(), e.value());
      }
    }
    global.insert_or_assign("loss_scaler",
                            loss_scaler_of(optimizer, states).to_ivalue(/*as_object=*/false));
  } else {
    DS_CHECK(optimizer.has("state") && optimizer.has("param_groups"), CheckpointError, path,
             ": its 'optimizer' is none of an optimizer state dict (state, param_groups), "
             "FP16_Optimizer's (fp32_groups_flat) and FP16_UnfusedOptimizer's (fp32_groups)");
    read_parameter_states(optimizer, states, path, &out);
    global.insert("optimizer_state_dict", states.optimizer);
  }
  raw.insert("optimizer_state_dict", global);
  raw.insert("ds_version", states.ds_version);
  out.optimizer_state = global_optimizer_state(raw, {}, path);
  add_frozen_from_module(states, &out);
  return out;
}

}  // namespace deepspeed::checkpoint::detail

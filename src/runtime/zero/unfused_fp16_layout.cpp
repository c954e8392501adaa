#include "runtime/zero/unfused_fp16_layout.h"

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

using c10::IValue;
using checkpoint::detail::as_int;
using checkpoint::detail::as_sequence;
using checkpoint::detail::as_tensor;
using checkpoint::detail::DictReader;
using Dict = c10::impl::GenericDict;
using List = c10::impl::GenericList;

Dict int_keyed_dict() { return Dict(c10::IntType::get(), c10::AnyType::get()); }

// Per-element state is a tensor of the parameter's (or the flat's) shape; the step is per group
// even where a parameter has one element.
bool is_per_element(const std::string& key, const IValue& v, at::IntArrayRef shape) {
  return key != "step" && v.isTensor() && v.toTensor().sizes() == shape;
}

// A copy of a saved param group with its 'params' replaced.
Dict group_with_params(const Dict& group, List params) {
  Dict out = checkpoint::new_dict();
  for (const auto& e : group) out.insert(e.key(), e.value());
  out.insert_or_assign("params", std::move(params));
  return out;
}

// `flat` (one group's parameters end to end) padded with zeros to `numel`.
at::Tensor padded(const at::Tensor& flat, int64_t numel) {
  if (flat.numel() == numel) return flat;
  at::Tensor out = at::zeros({numel}, flat.options());
  out.narrow(0, 0, flat.numel()).copy_(flat);
  return out;
}

}  // namespace

bool deepspeed_wraps_unfused(torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<onebit::CompressedCommunication*>(&optimizer) != nullptr) return false;
  return dynamic_cast<optim::Adam*>(&optimizer) == nullptr;
}

PerParameterState split_into_parameters(const std::vector<FlatGroupLayout>& layout,
                                        const std::vector<at::Tensor>& masters,
                                        const IValue& flat_state_dict) {
  const Dict top = flat_state_dict.toGenericDict();
  const Dict flat_state = top.at("state").toGenericDict();
  const auto flat_groups = top.at("param_groups").toListRef();
  DS_CHECK(masters.size() == layout.size() && flat_groups.size() == layout.size(), CheckpointError,
           "stage-0 checkpoint: ", layout.size(), " flat groups, ", masters.size(), " masters, ",
           flat_groups.size(), " optimizer param groups");
  List fp32_groups(c10::AnyType::get());
  Dict state = int_keyed_dict();
  List groups(c10::AnyType::get());
  int64_t index = 0;  // parameter indices run over the groups, as torch's state_dict numbers them
  for (size_t g = 0; g < layout.size(); ++g) {
    const IValue key(static_cast<int64_t>(g));  // one flat parameter per group
    const bool has_state = flat_state.contains(key);
    const Dict entry = has_state ? flat_state.at(key).toGenericDict() : int_keyed_dict();
    List masters_of_group(c10::AnyType::get());
    List ids(c10::AnyType::get());
    int64_t offset = 0;
    for (const auto& param : layout[g].params) {
      const std::vector<int64_t>& shape = param.second;
      const int64_t numel = c10::multiply_integers(shape);
      masters_of_group.push_back(masters[g].narrow(0, offset, numel).view(shape));
      if (has_state) {
        Dict per_param = checkpoint::new_dict();
        for (const auto& e : entry) {
          const IValue& v = e.value();
          if (is_per_element(e.key().toStringRef(), v, masters[g].sizes())) {
            per_param.insert(e.key(), v.toTensor().narrow(0, offset, numel).view(shape));
          } else if (v.isTensor()) {
            // Its own copy: torch's AdamW adds to a loaded step tensor in place, so a tensor
            // shared by the parameters (as the file would share it) would count once for each.
            per_param.insert(e.key(), v.toTensor().clone());
          } else {
            per_param.insert(e.key(), v);
          }
        }
        state.insert(index, per_param);
      }
      ids.push_back(index++);
      offset += numel;
    }
    fp32_groups.push_back(masters_of_group);
    groups.push_back(group_with_params(flat_groups[g].toGenericDict(), ids));
  }
  Dict out = checkpoint::new_dict();
  out.insert("state", state);
  out.insert("param_groups", groups);
  return {fp32_groups, out};
}

FlatState join_parameters(const std::vector<FlatGroupLayout>& layout, const IValue& fp32_groups,
                          const IValue& state_dict, const std::string& path) {
  const std::string where = path + ": 'optimizer' ";
  const auto saved_masters = as_sequence(fp32_groups, where + "'fp32_groups'");
  DictReader top(state_dict, where + "'optimizer_state_dict'");
  const auto saved_groups = as_sequence(top.at("param_groups"), top.where("param_groups"));
  const Dict saved_state = top.at("state").toGenericDict();
  DS_CHECK(saved_masters.size() == layout.size() && saved_groups.size() == layout.size(),
           CheckpointError, where, "has ", saved_masters.size(), " fp32_groups and ",
           saved_groups.size(), " param groups, this engine ", layout.size(), " param groups");
  FlatState out;
  Dict state = int_keyed_dict();
  List groups(c10::AnyType::get());
  for (size_t g = 0; g < layout.size(); ++g) {
    const std::string at_group = where + "fp32_groups[" + std::to_string(g) + "]";
    const auto masters = as_sequence(saved_masters[g], at_group);
    DictReader group(saved_groups[g], top.where("param_groups") + "[" + std::to_string(g) + "]");
    const auto ids = as_sequence(group.at("params"), group.where("params"));
    const auto& params = layout[g].params;
    DS_CHECK(masters.size() == params.size() && ids.size() == params.size(), CheckpointError,
             at_group, " holds ", masters.size(), " parameters (", ids.size(),
             " in its param group), this engine's group ", params.size(),
             "; the model or its param groups differ from the checkpoint's");
    std::vector<at::Tensor> pieces;
    std::vector<Dict> entries;
    for (size_t j = 0; j < params.size(); ++j) {
      const auto& [name, shape] = params[j];
      const at::Tensor master = as_tensor(masters[j], at_group + "[" + std::to_string(j) + "]");
      DS_CHECK(master.sizes() == at::IntArrayRef(shape), CheckpointError, at_group, "[", j,
               "] has shape ", master.sizes(), ", parameter '", name, "' ",
               at::IntArrayRef(shape));
      pieces.push_back(master.to(at::kFloat).reshape(-1));
      const IValue id = ids[j];
      if (saved_state.contains(id)) entries.push_back(saved_state.at(id).toGenericDict());
    }
    const int64_t partition_numel = layout[g].partition_numel;
    out.masters.push_back(padded(at::cat(pieces), partition_numel));
    List flat_id(c10::AnyType::get());
    flat_id.push_back(static_cast<int64_t>(g));
    groups.push_back(group_with_params(group.dict(), flat_id));
    // Before the first step no parameter has state; after it every one has.
    if (entries.empty()) continue;
    DS_CHECK(entries.size() == params.size(), CheckpointError, top.where("state"), ": ",
             entries.size(), " of the ", params.size(), " parameters of param group ", g,
             " have optimizer state; expected all or none");
    Dict flat = checkpoint::new_dict();
    for (const auto& e : entries.front()) {
      const std::string key = e.key().toStringRef();
      const IValue& first = e.value();
      if (!is_per_element(key, first, params[0].second)) {
        flat.insert(key, first);  // per group (the step): the first parameter's
        continue;
      }
      std::vector<at::Tensor> parts;
      for (size_t j = 0; j < params.size(); ++j) {
        const int64_t id = as_int(ids[j], group.where("params"));
        const std::string at_state =
            top.where("state") + "[" + std::to_string(id) + "]['" + key + "']";
        DS_CHECK(entries[j].contains(key), CheckpointError, at_state, " is missing (parameter '",
                 params[j].first, "')");
        const at::Tensor t = as_tensor(entries[j].at(key), at_state);
        DS_CHECK(t.sizes() == at::IntArrayRef(params[j].second), CheckpointError, at_state,
                 " has shape ", t.sizes(), ", parameter '", params[j].first, "' ",
                 at::IntArrayRef(params[j].second));
        parts.push_back(t.reshape(-1));
      }
      flat.insert(key, padded(at::cat(parts), partition_numel));
    }
    state.insert(static_cast<int64_t>(g), flat);
  }
  Dict sd = checkpoint::new_dict();
  sd.insert("state", state);
  sd.insert("param_groups", groups);
  out.optimizer_state_dict = sd;
  return out;
}

}  // namespace deepspeed::runtime

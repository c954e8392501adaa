// ZeroOptimizerStates between DeepSpeed's two layouts of a ZeRO-1/2 rank's optimizer state.
//
// Note [Elastic ZeRO checkpoints]
// With zero_optimization.elastic_checkpoint, DeepSpeed's ZeRO-1/2 state_dict() replaces the
// inner optimizer's state_dict ("rigid": {"state": {id: ...}, "param_groups": [...]}) by one
// dict per param group holding the state of its flat partition with the alignment padding cut
// off, and saves param_groups[0]["step"] beside it as "base_optimizer_state_step". Without the
// padding every rank's states join into the unpadded group, which is how DeepSpeed loads onto
// another data-parallel size. Our loader re-partitions rigid files too, so an elastic file is
// read by turning it back into the rigid layout of the rank that wrote it: the one path then
// serves both. DeepSpeed reads "base_optimizer_state_step" unconditionally when it loads an
// elastic file, but writes it only for optimizers that keep their step in the param group
// (FusedAdam): we always write it, from the state, so that DeepSpeed reads ours with any
// optimizer (its torch.optim.AdamW and CPU-Adam included).
#include <algorithm>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using detail::DictReader;
using List = c10::impl::GenericList;

constexpr const char* kStepKey = "base_optimizer_state_step";

bool per_element(const IValue& v) { return v.isTensor() && v.toTensor().dim() > 0; }

int64_t step_count(const IValue& v, const std::string& where) {
  if (v.isTensor()) {
    DS_CHECK(v.toTensor().numel() == 1, CheckpointError, where, " is a tensor of ",
             v.toTensor().numel(), " elements, expected a step count");
    return static_cast<int64_t>(v.toTensor().item<double>());
  }
  return static_cast<int64_t>(detail::as_double(v, where));
}

int64_t padding_of(const std::vector<int64_t>& paddings, size_t g) {
  return g < paddings.size() ? paddings[g] : 0;
}

}  // namespace

void ZeroOptimizerStates::make_elastic(bool step_as_tensor) {
  if (elastic()) return;
  const DictReader base(base_optimizer_state, "base_optimizer_state");
  const Dict state = base.at("state").toGenericDict();
  const auto groups = detail::as_sequence(base.at("param_groups"), base.where("param_groups"));
  List out(c10::AnyType::get());
  std::optional<int64_t> step;
  for (size_t g = 0; g < groups.size(); ++g) {
    const DictReader group(groups[g], base.where("param_groups") + "[" + std::to_string(g) + "]");
    const auto params = detail::as_sequence(group.at("params"), group.where("params"));
    DS_CHECK(params.size() == 1, UsageError, group.where("params"), " lists ", params.size(),
             " parameters; an elastic checkpoint needs one flat partition per param group");
    Dict lean = new_dict();
    const IValue id(detail::as_int(params[0], group.where("params")));
    if (state.contains(id)) {
      for (const auto& e : state.at(id).toGenericDict()) {
        const IValue& v = e.value();
        const bool is_step = e.key().isString() && e.key().toStringRef() == "step";
        if (per_element(v)) {
          const at::Tensor t = v.toTensor().reshape(-1);
          lean.insert(e.key(), t.narrow(0, 0, t.numel() - padding_of(group_paddings, g)));
        } else if (is_step) {
          const int64_t n = step_count(v, "state[" + std::to_string(id.toInt()) + "].step");
          if (!step) step = n;
          lean.insert(e.key(), step_as_tensor ? IValue(at::scalar_tensor(static_cast<double>(n),
                                                                         at::kFloat))
                                              : IValue(n));
        } else {
          lean.insert(e.key(), v);
        }
      }
    }
    out.push_back(IValue(lean));
  }
  base_optimizer_state = IValue(out);
  extra.erase(std::remove_if(extra.begin(), extra.end(),
                             [](const auto& e) { return e.first == kStepKey; }),
              extra.end());
  extra.emplace_back(kStepKey, IValue(step.value_or(0)));
}

void ZeroOptimizerStates::make_rigid(const IValue& param_groups, const std::string& source) {
  if (!elastic()) return;
  const std::string where = source + ": base_optimizer_state";
  const auto lean_groups = detail::as_sequence(base_optimizer_state, where);
  const auto groups = detail::as_sequence(param_groups, "the optimizer's param_groups");
  DS_CHECK(lean_groups.size() == single_partition_of_fp32_groups.size() &&
               lean_groups.size() == groups.size(),
           CheckpointError, where, " (elastic) holds ", lean_groups.size(),
           " param groups, single_partition_of_fp32_groups ",
           single_partition_of_fp32_groups.size(), ", this engine's optimizer ", groups.size());
  std::optional<IValue> step;
  for (const auto& [key, value] : extra) {
    if (key == kStepKey) step = IValue(step_count(value, source + ": '" + kStepKey + "'"));
  }
  Dict state(c10::IntType::get(), c10::AnyType::get());
  for (size_t g = 0; g < lean_groups.size(); ++g) {
    const std::string at = where + "[" + std::to_string(g) + "]";
    const DictReader lean(lean_groups[g], at);
    if (lean.dict().size() == 0) continue;  // no step taken yet
    const DictReader group(groups[g], "the optimizer's param_groups[" + std::to_string(g) + "]");
    const auto params = detail::as_sequence(group.at("params"), group.where("params"));
    DS_CHECK(params.size() == 1, CheckpointError, group.where("params"), " lists ",
             params.size(), " parameters, expected the one flat partition of the group");
    const int64_t real = single_partition_of_fp32_groups[g].numel();
    const int64_t padding = padding_of(group_paddings, g);
    Dict per = new_dict();
    for (const auto& e : lean.dict()) {
      const IValue& v = e.value();
      if (!per_element(v)) {
        per.insert(e.key(), v);
        continue;
      }
      const at::Tensor t = v.toTensor().reshape(-1);
      DS_CHECK(t.numel() == real, CheckpointError, at, ": '",
               e.key().isString() ? e.key().toStringRef() : std::string("?"), "' has ",
               t.numel(), " elements, its fp32 partition ", real);
      per.insert(e.key(), padding > 0 ? at::constant_pad_nd(t, {0, padding}) : t);
    }
    if (!per.contains("step") && step) per.insert("step", *step);
    state.insert(detail::as_int(params[0], group.where("params")), IValue(per));
  }
  Dict rigid = new_dict();
  rigid.insert("state", IValue(state));
  rigid.insert("param_groups", param_groups);
  base_optimizer_state = IValue(rigid);
}

}  // namespace deepspeed::checkpoint

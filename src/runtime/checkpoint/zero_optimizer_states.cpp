// ZeroOptimizerStates <-> the dict of [bf16_]zero_pp_rank_R_mp_rank_XX_optim_states.pt: what
// DeepSpeed's ZeRO-1/2 optimizer state_dict() returns (reference §6.3). The loss scaler and the
// fragment addresses are written either as DeepSpeed's Python objects (so that Python DeepSpeed
// resumes from the file) or as plain dicts of the same attributes (so that torch.load's
// weights_only loader accepts it); the reader takes both.
#include <algorithm>

#include <ATen/ATen.h>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "runtime/zero/bf16_optimizer_layout.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using detail::DictReader;
using List = c10::impl::GenericList;

constexpr const char* kDynamicScaler = "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler";
constexpr const char* kStaticScaler = "deepspeed.runtime.fp16.loss_scaler.LossScaler";
constexpr const char* kFragmentAddress = "deepspeed.utils.tensor_fragment.fragment_address";

const std::vector<std::string>& own_keys() {
  static const std::vector<std::string> keys = {
      "loss_scaler", "dynamic_loss_scale", "overflow", "clip_grad", "base_optimizer_state",
      "single_partition_of_fp32_groups", "zero_stage", "group_paddings", "partition_count",
      "ds_version", "param_slice_mappings"};
  return keys;
}

std::string dtype_global(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kFloat: return "torch.float32";
    default:
      DS_CHECK(false, UsageError, "loss scaler dtype ", dtype, " is not fp16, bf16 or fp32");
  }
  return {};
}

at::ScalarType dtype_from_global(const IValue& value, const std::string& where) {
  // torch.float16 itself (DeepSpeed's pickle) or its name (our plain-values files).
  auto object = as_python_object(value);
  DS_CHECK((object && object->is_global) || value.isString(), CheckpointError, where,
           " is not a torch dtype");
  const std::string name = object ? object->class_path : value.toStringRef();
  if (name == "torch.float16" || name == "torch.half") return at::kHalf;
  if (name == "torch.bfloat16") return at::kBFloat16;
  if (name == "torch.float32" || name == "torch.float") return at::kFloat;
  DS_CHECK(false, CheckpointError, where, " is ", name, ", expected torch.float16/bfloat16/float32");
  return at::kFloat;
}

IValue int_list(const std::vector<int64_t>& values) {
  List list(c10::AnyType::get());
  for (int64_t v : values) list.push_back(v);
  return IValue(list);
}

}  // namespace

IValue LossScalerState::to_ivalue(bool as_object) const {
  // LossScalerBase.__init__ sets cur_scale and dynamic; DynamicLossScaler adds the rest.
  Dict state = new_dict();
  state.insert("cur_scale", cur_scale);
  state.insert("dynamic", dynamic);
  if (!dynamic) return as_object ? python_object(kStaticScaler, {}, state) : IValue(state);
  state.insert("cur_iter", cur_iter);
  state.insert("last_overflow_iter", last_overflow_iter);
  state.insert("scale_factor", scale_factor);
  state.insert("scale_window", scale_window);
  state.insert("min_scale", min_scale);
  state.insert("delayed_shift", delayed_shift);
  state.insert("cur_hysteresis", cur_hysteresis);
  state.insert("consecutive_hysteresis", consecutive_hysteresis);
  state.insert("raise_error_at_min_scale", raise_error_at_min_scale);
  if (!as_object) {
    state.insert("dtype", dtype_global(dtype));
    return IValue(state);
  }
  state.insert("dtype", python_global(dtype_global(dtype)));
  return python_object(kDynamicScaler, {}, state);
}

LossScalerState LossScalerState::from_ivalue(const IValue& value, const std::string& where) {
  auto object = as_python_object(value);
  DictReader r(object ? IValue(object->state) : value, where);
  LossScalerState s;
  s.cur_scale = r.get_double("cur_scale");
  s.dynamic = r.has_value("dynamic") ? r.get_bool("dynamic")
                                     : (object && object->class_path == kDynamicScaler);
  if (!s.dynamic) return s;
  s.cur_iter = r.get_int("cur_iter");
  s.last_overflow_iter = r.get_int("last_overflow_iter");
  s.scale_factor = r.get_double("scale_factor");
  s.scale_window = r.get_int("scale_window");
  s.min_scale = r.get_double("min_scale");
  s.delayed_shift = r.get_int("delayed_shift");
  s.cur_hysteresis = r.get_int("cur_hysteresis");
  s.consecutive_hysteresis = r.get_bool("consecutive_hysteresis");
  if (r.has_value("raise_error_at_min_scale")) {
    s.raise_error_at_min_scale = r.get_bool("raise_error_at_min_scale");
  }
  if (r.has_value("dtype")) s.dtype = dtype_from_global(r.at("dtype"), r.where("dtype"));
  return s;
}

IValue ZeroOptimizerStates::to_ivalue() const {
  DS_CHECK(zero_stage == 1 || zero_stage == 2, UsageError, "ZeroOptimizerStates.zero_stage is ",
           zero_stage, ", expected 1 or 2");
  Dict d = new_dict();
  if (!bf16_optimizer) {
    d.insert("loss_scaler", loss_scaler.to_ivalue(python_objects));
    d.insert("dynamic_loss_scale", dynamic_loss_scale);
    d.insert("overflow", overflow);
  }
  d.insert("clip_grad", clip_grad);
  d.insert("base_optimizer_state", base_optimizer_state);
  List partitions(c10::AnyType::get());
  for (size_t g = 0; g < single_partition_of_fp32_groups.size(); ++g) {
    const at::Tensor& t = single_partition_of_fp32_groups[g];
    const int64_t padding = g < group_paddings.size() ? group_paddings[g] : 0;
    partitions.push_back(bf16_optimizer && padding > 0
                             ? at::constant_pad_nd(t.reshape(-1), {0, padding})
                             : t);
  }
  d.insert("single_partition_of_fp32_groups", IValue(partitions));
  // An int rather than DeepSpeed's ZeroStageEnum (an int subclass): compares the same in Python
  // and keeps the file free of one more DeepSpeed class.
  if (!bf16_optimizer) d.insert("zero_stage", zero_stage);
  d.insert("group_paddings", int_list(group_paddings));
  d.insert("partition_count", int_list(partition_count));
  d.insert("ds_version", ds_version);
  List mappings(c10::AnyType::get());
  for (const auto& group : param_slice_mappings) {
    Dict names = new_dict();
    for (const auto& item : group) {
      Dict address = new_dict();
      address.insert("numel", item.value().numel);
      address.insert("start", item.value().start);
      names.insert(item.key(), python_objects ? python_object(kFragmentAddress, {}, address)
                                              : IValue(address));
    }
    mappings.push_back(IValue(names));
  }
  d.insert("param_slice_mappings", IValue(mappings));
  for (const auto& [key, value] : extra) d.insert_or_assign(key, value);
  return IValue(d);
}

ZeroOptimizerStates ZeroOptimizerStates::from_ivalue(const IValue& value,
                                                     const std::string& source) {
  DictReader r(value, source);
  ZeroOptimizerStates z;
  // No zero_stage: BF16_Optimizer's state, partitioned as ZeRO-1's.
  z.bf16_optimizer = !r.has("zero_stage");
  z.zero_stage = z.bf16_optimizer ? 1 : detail::as_zero_stage(r.at("zero_stage"),
                                                              r.where("zero_stage"));
  DS_CHECK(z.zero_stage == 1 || z.zero_stage == 2, NotSupportedError, source, ": zero_stage is ",
           z.zero_stage, "; this reader handles ZeRO stages 1 and 2");
  if (r.has_value("loss_scaler")) {
    z.loss_scaler = LossScalerState::from_ivalue(r.at("loss_scaler"), r.where("loss_scaler"));
  }
  if (r.has_value("dynamic_loss_scale")) z.dynamic_loss_scale = r.get_bool("dynamic_loss_scale");
  if (r.has_value("overflow")) z.overflow = r.get_bool("overflow");
  if (r.has_value("clip_grad")) z.clip_grad = r.get_double("clip_grad");
  z.base_optimizer_state = r.at("base_optimizer_state");
  z.single_partition_of_fp32_groups = detail::as_flat_tensors(
      r.at("single_partition_of_fp32_groups"), r.where("single_partition_of_fp32_groups"));
  if (r.has_value("group_paddings")) {
    z.group_paddings = detail::as_ints(r.at("group_paddings"), r.where("group_paddings"));
  }
  if (z.bf16_optimizer) {  // each partition holds its padding there
    runtime::drop_bf16_optimizer_padding(&z.single_partition_of_fp32_groups, z.group_paddings);
  }
  z.partition_count = detail::as_ints(r.at("partition_count"), r.where("partition_count"));
  if (r.has_value("ds_version")) z.ds_version = r.get_string("ds_version");
  if (r.has_value("param_slice_mappings")) {
    const std::string where = r.where("param_slice_mappings");
    for (const auto& group : detail::as_sequence(r.at("param_slice_mappings"), where)) {
      DictReader names(group, where);
      torch::OrderedDict<std::string, FragmentAddress> out;
      for (const auto& entry : names.dict()) {
        const std::string name = detail::as_string(entry.key(), where + " key");
        auto object = as_python_object(entry.value());
        DictReader address(object ? IValue(object->state) : entry.value(), names.where(name));
        out.insert(name, FragmentAddress{address.get_int("numel"), address.get_int("start")});
      }
      z.param_slice_mappings.push_back(std::move(out));
    }
  }
  for (const auto& entry : r.dict()) {
    if (!entry.key().isString()) continue;
    const std::string& key = entry.key().toStringRef();
    if (std::find(own_keys().begin(), own_keys().end(), key) == own_keys().end()) {
      z.extra.emplace_back(key, entry.value());
    }
  }
  return z;
}

void ZeroOptimizerStates::check_partition_count(int64_t dp_world_size,
                                                const std::string& source) const {
  for (size_t g = 0; g < partition_count.size(); ++g) {
    DS_CHECK(partition_count[g] == dp_world_size, CheckpointError, source, ": written by ",
             partition_count[g], " data-parallel ranks (param group ", g, "), this job has ",
             dp_world_size, ". ZeRO cannot re-partition optimizer state on load (as in DeepSpeed): "
             "resume with ", partition_count[g], " ranks, load with load_optimizer_states=false, "
             "or consolidate the weights with zero_to_fp32");
  }
}

IValue ZeroOptimizerFile::to_ivalue() const {
  Dict d = new_dict();
  d.insert("optimizer_state_dict", optimizer_state_dict.to_ivalue());
  d.insert("ds_config", ivalue_from_json(ds_config));
  d.insert("ds_version", ds_version);
  return IValue(d);
}

ZeroOptimizerFile ZeroOptimizerFile::from_ivalue(const IValue& value, const std::string& source) {
  DictReader r(value, source);
  ZeroOptimizerFile f;
  DS_CHECK(r.has("optimizer_state_dict"), CheckpointError, source,
           ": no 'optimizer_state_dict', so this is not a DeepSpeed ZeRO optimizer file");
  f.optimizer_state_dict = ZeroOptimizerStates::from_ivalue(r.at("optimizer_state_dict"),
                                                            source + ": optimizer_state_dict");
  if (r.has_value("ds_config")) f.ds_config = json_from_ivalue(r.at("ds_config"), r.where("ds_config"));
  if (r.has_value("ds_version")) f.ds_version = r.get_string("ds_version");
  return f;
}

}  // namespace deepspeed::checkpoint

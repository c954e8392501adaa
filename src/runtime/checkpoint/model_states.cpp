// ModelStates <-> the dict of mp_rank_XX_model_states.pt, key for key as DeepSpeed's
// _common_checkpoint_state writes it (reference §6.2), and the client_state rule of its
// load_checkpoint (§5.5).
#include <algorithm>
#include <set>

#include "deepspeed/checkpoint.h"
#include "runtime/checkpoint/value_access.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

using c10::IValue;
using detail::DictReader;
using List = c10::impl::GenericList;

constexpr const char* kParallelDims = "checkpoint_parallel_dimensions";

// The keys ModelStates owns; every other top-level key is client state.
const std::set<std::string>& own_keys() {
  static const std::set<std::string> keys = {
      "module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes",
      "shared_params", "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd",
      "sparse_tensor_module_names", "skipped_steps", "global_steps", "global_samples",
      "dp_world_size", "mp_world_size", kParallelDims, "ds_config", "ds_version"};
  return keys;
}

IValue shapes_to_ivalue(const ShapeDict& shapes) {
  Dict dict = new_dict();
  for (const auto& item : shapes) dict.insert(item.key(), torch_size(item.value()));
  return IValue(dict);
}

ShapeDict shapes_from_ivalue(const IValue& value, const std::string& where) {
  DictReader reader(value, where);
  ShapeDict shapes;
  for (const auto& entry : reader.dict()) {
    const std::string key = detail::as_string(entry.key(), where + " key");
    shapes.insert(key, shape_from_ivalue(entry.value(), reader.where(key)));
  }
  return shapes;
}

IValue string_list(const std::vector<std::string>& items) {
  List list(c10::AnyType::get());
  for (const auto& item : items) list.push_back(item);
  return IValue(list);
}

std::vector<std::string> strings_from(const IValue& value, const std::string& where) {
  std::vector<std::string> out;
  for (const auto& item : detail::as_sequence(value, where)) {
    out.push_back(detail::as_string(item, where + " item"));
  }
  return out;
}

}  // namespace

IValue ModelStates::to_ivalue() const {
  Dict d = new_dict();
  d.insert("module", module_in_layer_files ? IValue() : ivalue_from_tensors(module));
  d.insert("buffer_names", string_list(buffer_names));
  d.insert("optimizer", optimizer);
  if (param_shapes) {
    List groups(c10::AnyType::get());
    for (const auto& group : *param_shapes) groups.push_back(shapes_to_ivalue(group));
    d.insert("param_shapes", IValue(groups));
  } else {
    d.insert("param_shapes", IValue());
  }
  d.insert("frozen_param_shapes",
           frozen_param_shapes ? shapes_to_ivalue(*frozen_param_shapes) : IValue());
  if (shared_params) {
    Dict shared = new_dict();
    for (const auto& [alias, source] : *shared_params) shared.insert(alias, source);
    d.insert("shared_params", IValue(shared));
  } else {
    d.insert("shared_params", IValue());
  }
  d.insert("frozen_param_fragments",
           frozen_param_fragments ? ivalue_from_tensors(*frozen_param_fragments) : IValue());
  d.insert("lr_scheduler", lr_scheduler);
  d.insert("data_sampler", data_sampler);
  d.insert("random_ltd", random_ltd);
  std::vector<IValue> sparse(sparse_tensor_module_names.begin(), sparse_tensor_module_names.end());
  d.insert("sparse_tensor_module_names", python_set(std::move(sparse)));
  d.insert("skipped_steps", skipped_steps);
  d.insert("global_steps", global_steps);
  d.insert("global_samples", global_samples);
  d.insert("dp_world_size", dp_world_size);
  d.insert("mp_world_size", mp_world_size);
  Dict dims = new_dict();
  dims.insert("pp_degree", checkpoint_parallel_dimensions.pp_degree);
  dims.insert("tp_degree", checkpoint_parallel_dimensions.tp_degree);
  d.insert(kParallelDims, IValue(dims));
  d.insert("ds_config", ivalue_from_json(ds_config));
  d.insert("ds_version", ds_version);
  for (const auto& [key, value] : client_state) {
    DS_CHECK(key != kParallelDims, UsageError, "client_state contains the reserved checkpoint key '",
             kParallelDims, "' (DeepSpeed uses it for checkpoint metadata); rename it");
    d.insert_or_assign(key, value);  // DeepSpeed: state.update(client_state)
  }
  return IValue(d);
}

ModelStates ModelStates::from_ivalue(const IValue& value, const std::string& source) {
  DictReader r(value, source);
  ModelStates m;
  DS_CHECK(r.has("module"), CheckpointError, source,
           ": no 'module' key, so this is not a DeepSpeed model-states file");
  if (r.has_value("module")) {
    m.module = tensors_from_ivalue(r.at("module"), r.where("module"));
  } else {
    m.module_in_layer_files = true;
  }
  if (r.has_value("buffer_names")) {
    m.buffer_names = strings_from(r.at("buffer_names"), r.where("buffer_names"));
  }
  m.optimizer = r.has("optimizer") ? r.at("optimizer") : IValue();
  if (r.has_value("param_shapes")) {
    m.param_shapes.emplace();
    size_t i = 0;
    for (const auto& group : detail::as_sequence(r.at("param_shapes"), r.where("param_shapes"))) {
      m.param_shapes->push_back(
          shapes_from_ivalue(group, r.where("param_shapes") + "[" + std::to_string(i++) + "]"));
    }
  }
  if (r.has_value("frozen_param_shapes")) {
    m.frozen_param_shapes =
        shapes_from_ivalue(r.at("frozen_param_shapes"), r.where("frozen_param_shapes"));
  }
  if (r.has_value("shared_params")) {
    DictReader shared(r.at("shared_params"), r.where("shared_params"));
    m.shared_params.emplace();
    for (const auto& entry : shared.dict()) {
      const std::string alias = detail::as_string(entry.key(), shared.where() + " key");
      m.shared_params->emplace_back(alias, detail::as_string(entry.value(), shared.where(alias)));
    }
  }
  if (r.has_value("frozen_param_fragments")) {
    m.frozen_param_fragments =
        tensors_from_ivalue(r.at("frozen_param_fragments"), r.where("frozen_param_fragments"));
  }
  for (auto [key, member] : {std::pair{"lr_scheduler", &m.lr_scheduler},
                             std::pair{"data_sampler", &m.data_sampler},
                             std::pair{"random_ltd", &m.random_ltd}}) {
    *member = r.has(key) ? r.at(key) : IValue();
  }
  if (r.has_value("sparse_tensor_module_names")) {
    m.sparse_tensor_module_names =
        strings_from(r.at("sparse_tensor_module_names"), r.where("sparse_tensor_module_names"));
  }
  m.skipped_steps = r.has_value("skipped_steps") ? r.get_int("skipped_steps") : 0;
  m.global_steps = r.has_value("global_steps") ? r.get_int("global_steps") : 0;
  // DeepSpeed: global_samples defaults to global_steps * train_batch_size, which the engine
  // knows; -1 tells it the file had none.
  m.global_samples = r.has_value("global_samples") ? r.get_int("global_samples") : -1;
  m.dp_world_size = r.has_value("dp_world_size") ? r.get_int("dp_world_size") : 1;
  m.mp_world_size = r.has_value("mp_world_size") ? r.get_int("mp_world_size") : 1;
  if (r.has_value(kParallelDims)) {
    DictReader dims(r.at(kParallelDims), r.where(kParallelDims));
    if (dims.has_value("pp_degree")) m.checkpoint_parallel_dimensions.pp_degree = dims.get_int("pp_degree");
    if (dims.has_value("tp_degree")) m.checkpoint_parallel_dimensions.tp_degree = dims.get_int("tp_degree");
  }
  if (r.has_value("ds_config")) m.ds_config = json_from_ivalue(r.at("ds_config"), r.where("ds_config"));
  if (r.has_value("ds_version")) m.ds_version = r.get_string("ds_version");
  for (const auto& entry : r.dict()) {
    if (!entry.key().isString() || own_keys().count(entry.key().toStringRef())) continue;
    m.client_state.emplace_back(entry.key().toStringRef(), entry.value());
  }
  return m;
}

Dict client_state_of(const IValue& model_states, bool load_module_only, bool lr_scheduler_loaded,
                     bool optimizer_loaded) {
  std::set<std::string> excluded = {"module"};
  if (!load_module_only) {
    excluded.insert({"sparse_tensor_module_names", "skipped_steps", "global_steps",
                     "dp_world_size", "mp_world_size", "data_sampler", "random_ltd"});
  }
  if (lr_scheduler_loaded) excluded.insert("lr_scheduler");
  if (optimizer_loaded) excluded.insert("optimizer");
  DictReader r(model_states, "model states");
  Dict out = new_dict();
  for (const auto& entry : r.dict()) {
    if (entry.key().isString() && excluded.count(entry.key().toStringRef())) continue;
    out.insert(entry.key(), entry.value());
  }
  return out;
}

}  // namespace deepspeed::checkpoint

// See autoep_layers_metadata.h.
#include "runtime/checkpoint/autoep_layers_metadata.h"

#include <map>

#include "deepspeed/auto_ep.h"
#include "deepspeed/checkpoint.h"
#include "deepspeed/moe.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

using nlohmann::json;

// DeepSpeed's uniform placement: expert-parallel rank r holds experts [r * L, (r + 1) * L).
json placement(int64_t num_experts, int64_t local, int64_t ep_size) {
  json ranks = json::array();
  for (int64_t r = 0; r < ep_size; ++r) {
    json experts = json::array();
    for (int64_t e = r * local; e < (r + 1) * local; ++e) experts.push_back(e);
    ranks.push_back({{"rank", r}, {"experts", experts}});
  }
  return {{"version", 1}, {"num_experts", num_experts}, {"ep_size", ep_size}, {"ranks", ranks}};
}

json entry(int64_t layer_id, const std::string& path, const moe::TokenChoiceMoEImpl& layer,
           bool zero3) {
  const moe::ExpertGroups& g = *layer.ep_groups();
  const int64_t ep = g.expert_parallel.size();
  const int64_t local = layer.num_local_experts();
  return {{"moe_layer_id", layer_id},
          {"module_path", path},
          {"num_experts", layer.num_experts()},
          {"num_local_experts", local},
          {"ep_size", ep},
          {"expert_placement", placement(layer.num_experts(), local, ep)},
          {"expert_key_prefix", (path.empty() ? "" : path + ".") + "experts"},
          {"checkpoint_format", zero3 ? kZero3PartitionedFormat : "per_expert_files"},
          {"checkpoint_format_version", zero3 ? json(1) : json(nullptr)},
          {"ep_group_name", g.name},
          {"ep_rank", g.expert_parallel.rank()},
          {"expert_data_parallel_rank", g.expert_data_parallel.rank()},
          {"expert_data_parallel_world_size", g.expert_data_parallel.size()},
          {"global_expert_start", layer.first_expert()},
          {"global_expert_end", layer.first_expert() + local}};
}

}  // namespace

json autoep_layers_json(const c10::IValue& value, const std::string& where) {
  const std::string what = where + ": " + kAutoEPLayersKey;
  if (!value.isList()) return checkpoint::json_from_ivalue(value, what);
  json out = json::array();
  for (const c10::IValue& entry : value.toListRef()) {
    if (!entry.isGenericDict()) {
      out.push_back(checkpoint::json_from_ivalue(entry, what));
      continue;
    }
    json e = json::object();
    for (const auto& item : entry.toGenericDict()) {
      if (!item.key().isString()) continue;
      const std::string key = item.key().toStringRef();
      if (key == "affine_maps") continue;
      e[key] = checkpoint::json_from_ivalue(item.value(), what + "." + key);
    }
    out.push_back(std::move(e));
  }
  return out;
}

json autoep_layers_metadata(torch::nn::Module& module, bool zero3_partitioned) {
  json out = json::array();
  int64_t layer_id = 0;  // DeepSpeed's moe_layer_id counts its MoE layers too
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (std::dynamic_pointer_cast<moe::MoEImpl>(item.value())) {
      ++layer_id;
    } else if (auto t = std::dynamic_pointer_cast<moe::TokenChoiceMoEImpl>(item.value())) {
      if (t->ep_groups() == nullptr) continue;
      out.push_back(entry(layer_id++, item.key(), *t, zero3_partitioned));
    }
  }
  return out;
}

c10::IValue autoep_universal_checkpoint_info(const json& layers) {
  // As DeepSpeed's _save_moe_checkpoint builds it for AutoEP (version 0.4, its current one).
  const json info = {{"universal_checkpoint_version", 0.4},
                     {"expert_parameter_patterns", json::array({".*\\.experts\\.w[123]$"})},
                     {kAutoEPLayersKey, layers}};
  return checkpoint::ivalue_from_json(info);
}

bool has_zero3_partitioned_experts(const c10::IValue& ds_autoep_layers,
                                   const std::string& where) {
  if (ds_autoep_layers.isNone()) return false;
  const json layers = autoep_layers_json(ds_autoep_layers, where);
  if (!layers.is_array()) return false;
  for (const auto& e : layers) {
    if (e.is_object() && e.value("checkpoint_format", "") == kZero3PartitionedFormat) return true;
  }
  return false;
}

void check_autoep_placement(const c10::IValue& ds_autoep_layers, torch::nn::Module& module,
                            const std::string& file) {
  const json saved = autoep_layers_json(ds_autoep_layers, file);
  DS_CHECK(saved.is_array(), CheckpointError, file, ": ", kAutoEPLayersKey, " is not a list");
  std::map<std::string, json> own;
  for (auto& e : autoep_layers_metadata(module, /*zero3_partitioned=*/true)) {
    own[e["module_path"].get<std::string>()] = e;
  }
  const std::string head = file + ": " + kAutoEPLayersKey + ": ";
  for (const auto& e : saved) {
    DS_CHECK(e.is_object() && e.contains("module_path"), CheckpointError, head,
             "an entry has no module_path");
    if (e.value("checkpoint_format", "") != kZero3PartitionedFormat) continue;
    const std::string path = e["module_path"].get<std::string>();
    auto it = own.find(path);
    DS_CHECK(it != own.end(), CheckpointError, head, "layer '", path, "' is not an AutoEP "
             "layer of this model; AutoEP ZeRO-3 checkpoints load only with the parameter "
             "placement they were saved with");
    for (const char* field : {"num_experts", "ep_size", "ep_rank",
                              "expert_data_parallel_world_size"}) {
      DS_CHECK(e.contains(field) && e[field] == it->second[field], CheckpointError, head,
               "layer '", path, "' was saved with ", field, " ",
               e.contains(field) ? e[field].dump() : std::string("(missing)"), ", this rank has ",
               it->second[field].dump(), "; AutoEP ZeRO-3 checkpoints load only with the "
               "parameter placement they were saved with (the same world size and "
               "expert_parallel.autoep_size)");
    }
  }
}

}  // namespace deepspeed::runtime

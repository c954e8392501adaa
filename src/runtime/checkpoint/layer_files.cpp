// A pipeline's layer files (DeepSpeed's PipelineModule.save_state_dict): each stage's layers
// are saved one file per layer, and its model-states file holds 'module': None. This joins
// them back into the stage's module state dict for loaders and converters.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <set>

#include "deepspeed/checkpoint.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

constexpr const char* kTiedPrefix = "tied_modules.";

// "layer_07-model_states.pt" or "layer_07-model_01-model_states.pt" -> 7; -1 for any other
// name (MoE expert files are "layer_<L>_expert_<E>_mp_rank_..._model_states.pt").
int layer_index_of(const std::string& path, int tp_rank) {
  const std::string name = path.substr(path.rfind('/') + 1);
  int idx = -1;
  if (std::sscanf(name.c_str(), "layer_%d", &idx) != 1) return -1;
  return layer_file_name(idx, tp_rank) == name ? idx : -1;
}

// Loaded layer files, each read once.
class LayerFiles {
 public:
  LayerFiles(std::string tag_dir, int tp_rank) : tag_dir_(std::move(tag_dir)), tp_(tp_rank) {}

  const TensorDict& layer(int idx) {
    auto it = loaded_.find(idx);
    if (it != loaded_.end()) return it->second;
    const std::string path = tag_dir_ + "/" + layer_file_name(idx, tp_);
    DS_CHECK(::access(path.c_str(), F_OK) == 0, CheckpointError, "checkpoint ", tag_dir_, ": layer file ", path,
             " is missing (the model-states file keeps no module: a pipeline checkpoint)");
    return loaded_.emplace(idx, tensors_from_ivalue(load(path), path)).first->second;
  }

  // Every layer file of the folder, by index.
  std::vector<int> indices() const {
    std::vector<int> out;
    for (const auto& path : list_files_with_suffix(tag_dir_, "-model_states.pt")) {
      const int idx = layer_index_of(path, tp_);
      if (idx >= 0) out.push_back(idx);
    }
    return out;
  }

  std::string path(int idx) const { return tag_dir_ + "/" + layer_file_name(idx, tp_); }

 private:
  std::string tag_dir_;
  int tp_;
  std::map<int, TensorDict> loaded_;
};

}  // namespace

std::string layer_file_name(int layer_idx, int tp_rank) {
  char name[64];
  if (tp_rank >= 0) {
    std::snprintf(name, sizeof(name), "layer_%02d-model_%02d-model_states.pt", layer_idx,
                  tp_rank);
  } else {
    std::snprintf(name, sizeof(name), "layer_%02d-model_states.pt", layer_idx);
  }
  return name;
}

TensorDict module_from_layer_files(const std::string& tag_dir,
                                   const std::vector<std::string>& names, int tp_rank) {
  LayerFiles files(tag_dir, tp_rank);
  // Tied modules: key -> the names under it (rests), to find the one file holding them all.
  std::map<std::string, std::vector<std::string>> tied_rests;
  for (const auto& name : names) {
    if (name.rfind(kTiedPrefix, 0) != 0) continue;
    const std::string sub = name.substr(std::string(kTiedPrefix).size());
    const size_t dot = sub.find('.');
    DS_CHECK(dot != std::string::npos, CheckpointError, "checkpoint ", tag_dir, ": state name '",
             name, "' names no tensor inside its tied module");
    tied_rests[sub.substr(0, dot)].push_back(sub.substr(dot + 1));
  }
  std::map<std::string, int> tied_file;
  for (const auto& [key, rests] : tied_rests) {
    for (int idx : files.indices()) {
      const TensorDict& layer = files.layer(idx);
      bool all = true;
      for (const auto& rest : rests) all = all && layer.find(rest) != nullptr;
      if (all) {
        tied_file.emplace(key, idx);
        break;
      }
    }
    DS_CHECK(tied_file.count(key) == 1, CheckpointError, "checkpoint ", tag_dir,
             ": no layer file holds the tied module '", key, "' (", rests.front(), ", ...)");
  }
  TensorDict module;
  for (const auto& name : names) {
    int idx = -1;
    std::string rest;
    if (name.rfind(kTiedPrefix, 0) == 0) {
      const std::string sub = name.substr(std::string(kTiedPrefix).size());
      idx = tied_file.at(sub.substr(0, sub.find('.')));
      rest = sub.substr(sub.find('.') + 1);
    } else {
      const size_t dot = name.find('.');
      int consumed = 0;
      const bool numbered = dot != std::string::npos &&
                            std::sscanf(name.c_str(), "%d%n", &idx, &consumed) == 1 &&
                            static_cast<size_t>(consumed) == dot;
      DS_CHECK(numbered, CheckpointError, "checkpoint ", tag_dir, ": state name '", name,
               "' is neither '<layer>.<name>' nor 'tied_modules.<key>.<name>', so no layer "
               "file holds it");
      rest = name.substr(dot + 1);
    }
    const at::Tensor* t = files.layer(idx).find(rest);
    DS_CHECK(t != nullptr, CheckpointError, "checkpoint ", files.path(idx), ": no entry '", rest,
             "' (for '", name, "')");
    module.insert(name, *t);
  }
  return module;
}

std::vector<std::string> listed_state_names(const ModelStates& states) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  auto add = [&](const std::string& name) {
    if (seen.insert(name).second) names.push_back(name);
  };
  if (states.param_shapes) {
    for (const auto& group : *states.param_shapes) {
      for (const auto& item : group) add(item.key());
    }
  }
  if (states.frozen_param_shapes) {
    for (const auto& item : *states.frozen_param_shapes) add(item.key());
  }
  for (const auto& name : states.buffer_names) add(name);
  return names;
}

}  // namespace deepspeed::checkpoint

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
    DS_CHECK(::access(path.c_str(), F_OK) == 0, CheckpointError, "checkpoint ", tag_dir_,
             ": layer file ", path,
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
  // Each name once: its layer index, or its tied module's key, and the name inside the layer.
  struct Entry {
    int idx = -1;
    std::string tied_key;
    std::string rest;
  };
  std::vector<Entry> entries;
  std::set<int> claimed;  // layers this stage names by index: none of them is a tied module
  std::map<std::string, std::vector<std::string>> tied_rests;
  for (const auto& name : names) {
    Entry e;
    const bool tied = name.rfind(kTiedPrefix, 0) == 0;
    const std::string sub = tied ? name.substr(std::string(kTiedPrefix).size()) : name;
    const size_t dot = sub.find('.');
    int consumed = 0;
    const bool ok = dot != std::string::npos &&
                    (tied || (std::sscanf(sub.c_str(), "%d%n", &e.idx, &consumed) == 1 &&
                              static_cast<size_t>(consumed) == dot));
    DS_CHECK(ok, CheckpointError, "checkpoint ", tag_dir, ": state name '", name,
             "' is neither '<layer>.<name>' nor 'tied_modules.<key>.<name>', so no layer file "
             "holds it");
    e.rest = sub.substr(dot + 1);
    if (tied) {
      e.tied_key = sub.substr(0, dot);
      tied_rests[e.tied_key].push_back(e.rest);
    } else {
      claimed.insert(e.idx);
    }
    entries.push_back(std::move(e));
  }
  LayerFiles files(tag_dir, tp_rank);
  std::map<std::string, int> tied_file;
  if (!tied_rests.empty()) {
    const std::vector<int> candidates = files.indices();
    for (const auto& [key, rests] : tied_rests) {
      for (int idx : candidates) {
        if (claimed.count(idx)) continue;
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
  }
  TensorDict module;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    const int idx = e.tied_key.empty() ? e.idx : tied_file.at(e.tied_key);
    const at::Tensor* t = files.layer(idx).find(e.rest);
    DS_CHECK(t != nullptr, CheckpointError, "checkpoint ", files.path(idx), ": no entry '",
             e.rest, "' (for '", names[i], "')");
    module.insert(names[i], *t);
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

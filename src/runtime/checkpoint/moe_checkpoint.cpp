// See moe_checkpoint.h.
#include "runtime/checkpoint/moe_checkpoint.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>

#include "deepspeed/auto_ep.h"
#include "deepspeed/moe.h"
#include "runtime/checkpoint/shared_file_writers.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

namespace ckpt = deepspeed::checkpoint;

std::string two_digits(int v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%02d", v);
  return buf;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// The MoE layers with their module names, in named_modules order (DeepSpeed's moe_layer_id,
// which counts its MoE layers and AutoEP's alike): one of the two pointers is set.
struct ExpertLayer {
  std::string name;
  std::shared_ptr<moe::MoEImpl> moe;
  std::shared_ptr<moe::TokenChoiceMoEImpl> token_choice;  // AutoEP's, once sharded
};

std::vector<ExpertLayer> expert_layers(torch::nn::Module& module) {
  std::vector<ExpertLayer> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto m = std::dynamic_pointer_cast<moe::MoEImpl>(item.value())) {
      out.push_back(ExpertLayer{item.key(), m, nullptr});
    } else if (auto t = std::dynamic_pointer_cast<moe::TokenChoiceMoEImpl>(item.value())) {
      if (t->ep_groups() != nullptr) out.push_back(ExpertLayer{item.key(), nullptr, t});
    }
  }
  return out;
}

// AutoEP's expert file entries (DeepSpeed's _save_moe_checkpoint for an AutoEPMoELayer): expert
// `id` of each stacked weight as "<layer>.experts.<w>.<id>".
constexpr const char* kStackedExpertWeights[] = {"w1", "w2", "w3"};

at::Tensor& stacked_weight(moe::TokenChoiceMoEImpl& layer, int w) {
  return w == 0 ? layer.experts->w1 : w == 1 ? layer.experts->w2 : layer.experts->w3;
}

std::string stacked_key(const std::string& module_name, int w) {
  return (module_name.empty() ? std::string() : module_name + ".") + "experts." +
         kStackedExpertWeights[w];
}

std::string prefixed(const std::string& module_name, const std::string& key) {
  return module_name.empty() ? key : module_name + "." + key;
}

// The entries of local expert `local` of `layer`, each as (key with local id, key with `id`).
std::vector<std::pair<std::string, std::string>> expert_keys(const std::string& module_name,
                                                             moe::MoEImpl& layer, int64_t local,
                                                             int64_t id) {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string local_prefix = std::string(kExpertKeyPrefix) + std::to_string(local) + ".";
  for (const auto& item : ckpt::module_state_dict(layer)) {
    const std::string& k = item.key();
    if (k.rfind(local_prefix, 0) != 0) continue;
    const std::string rest = k.substr(local_prefix.size());
    out.emplace_back(prefixed(module_name, k),
                     prefixed(module_name,
                              std::string(kExpertKeyPrefix) + std::to_string(id) + "." + rest));
  }
  return out;
}

}  // namespace

std::string expert_file_name(int moe_layer_id, int64_t global_expert_id, int mp_rank) {
  return "layer_" + std::to_string(moe_layer_id) + "_expert_" + std::to_string(global_expert_id) +
         "_mp_rank_" + two_digits(mp_rank) + "_model_states.pt";
}

std::string expert_optimizer_file_name(int ep_rank, int mp_rank) {
  return "expp_rank_" + std::to_string(ep_rank) + "_mp_rank_" + two_digits(mp_rank) +
         "_optim_states.pt";
}

std::set<std::string> expert_state_keys(torch::nn::Module& module,
                                        const std::vector<std::string>& keys) {
  std::set<std::string> out;
  const auto starts = [](const std::string& key, const std::string& prefix) {
    return key.compare(0, prefix.size(), prefix) == 0;
  };
  for (const auto& [name, layer, token_choice] : expert_layers(module)) {
    const std::string prefix = name.empty() ? "" : name + ".";
    for (const auto& key : keys) {
      if (!starts(key, prefix)) continue;
      const std::string rest = key.substr(prefix.size());
      if (token_choice ? rest == "experts.w1" || rest == "experts.w2" || rest == "experts.w3"
                       : key.find("expert") != std::string::npos &&
                             key.find("moe.gate.wg.weight") == std::string::npos) {
        out.insert(key);
      }
    }
  }
  return out;
}

ckpt::TensorDict without_expert_states(torch::nn::Module& module,
                                       const ckpt::TensorDict& module_state) {
  std::vector<std::string> keys;
  for (const auto& item : module_state) keys.push_back(item.key());
  const std::set<std::string> experts = expert_state_keys(module, keys);
  ckpt::TensorDict out;
  for (const auto& item : module_state) {
    if (!experts.count(item.key())) out.insert(item.key(), item.value());
  }
  return out;
}

void save_expert_files(torch::nn::Module& module, const std::string& tag_dir, int mp_rank,
                       bool node_local, const ckpt::FileSaver& save_file) {
  int layer_id = 0;
  for (const auto& [name, layer, token_choice] : expert_layers(module)) {
    const moe::ExpertGroups* g = layer ? layer->ep_groups() : token_choice->ep_groups();
    const bool writer = g == nullptr || ckpt::writes_shared_files(g->expert_data_parallel,
                                                                  node_local);
    if (writer && token_choice) {
      for (int64_t i = 0; i < token_choice->num_local_experts(); ++i) {
        const int64_t id = token_choice->first_expert() + i;
        ckpt::TensorDict expert;
        for (int w = 0; w < 3; ++w) {
          expert.insert(stacked_key(name, w) + "." + std::to_string(id),
                        stacked_weight(*token_choice, w)[i].detach().clone());
        }
        save_file(ckpt::ivalue_from_tensors(expert),
                  tag_dir + "/" + expert_file_name(layer_id, id, mp_rank));
      }
    } else if (writer) {
      const auto state = ckpt::module_state_dict(*layer);
      for (int64_t i = 0; i < layer->num_local_experts(); ++i) {
        const int64_t id = layer->global_expert_id(i);
        ckpt::TensorDict expert;
        for (const auto& [local_key, global_key] : expert_keys(name, *layer, i, id)) {
          const std::string inner = name.empty() ? local_key : local_key.substr(name.size() + 1);
          expert.insert(global_key, state[inner].detach().clone());
        }
        save_file(ckpt::ivalue_from_tensors(expert),
                  tag_dir + "/" + expert_file_name(layer_id, id, mp_rank));
      }
    }
    ++layer_id;
  }
}

namespace {

ckpt::TensorDict load_expert_file(const std::string& tag_dir, int layer_id, int64_t id,
                                  int mp_rank) {
  const std::string path = tag_dir + "/" + expert_file_name(layer_id, id, mp_rank);
  DS_CHECK(file_exists(path), CheckpointError, "load_checkpoint: ", path,
           " is missing: the checkpoint has no expert ", id, " for MoE layer ", layer_id,
           " (saved with fewer experts, or not an MoE checkpoint)");
  return ckpt::tensors_from_ivalue(ckpt::load(path), path);
}

const at::Tensor& expert_entry(const ckpt::TensorDict& saved, const std::string& key,
                               const std::string& file) {
  const at::Tensor* t = saved.find(key);
  DS_CHECK(t != nullptr, CheckpointError, file, ": has no entry '", key, "'");
  return *t;
}

}  // namespace

void add_expert_states(torch::nn::Module& module, const std::string& tag_dir, int mp_rank,
                       ckpt::TensorDict* module_state) {
  int layer_id = 0;
  for (const auto& [name, layer, token_choice] : expert_layers(module)) {
    if (token_choice) {
      // Each stacked weight is its experts' entries, stacked in local order.
      std::vector<std::vector<at::Tensor>> parts(3);
      for (int64_t i = 0; i < token_choice->num_local_experts(); ++i) {
        const int64_t id = token_choice->first_expert() + i;
        const ckpt::TensorDict saved = load_expert_file(tag_dir, layer_id, id, mp_rank);
        const std::string file = expert_file_name(layer_id, id, mp_rank);
        for (int w = 0; w < 3; ++w) {
          parts[static_cast<size_t>(w)].push_back(
              expert_entry(saved, stacked_key(name, w) + "." + std::to_string(id), file));
        }
      }
      for (int w = 0; w < 3; ++w) {
        module_state->insert(stacked_key(name, w), at::stack(parts[static_cast<size_t>(w)]));
      }
    } else {
      for (int64_t i = 0; i < layer->num_local_experts(); ++i) {
        const int64_t id = layer->global_expert_id(i);
        const ckpt::TensorDict saved = load_expert_file(tag_dir, layer_id, id, mp_rank);
        const std::string file = expert_file_name(layer_id, id, mp_rank);
        for (const auto& [local_key, global_key] : expert_keys(name, *layer, i, id)) {
          module_state->insert(local_key, expert_entry(saved, global_key, file));
        }
      }
    }
    ++layer_id;
  }
}

std::map<std::string, std::string> expert_global_names(torch::nn::Module& module) {
  std::map<std::string, std::string> out;
  for (const auto& [name, layer, token_choice] : expert_layers(module)) {
    if (token_choice) continue;  // AutoEP's stacked weights keep their names
    for (int64_t i = 0; i < layer->num_local_experts(); ++i) {
      const int64_t id = layer->global_expert_id(i);
      for (auto& [local_key, global_key] : expert_keys(name, *layer, i, id)) {
        out.emplace(std::move(local_key), std::move(global_key));
      }
    }
  }
  return out;
}

std::vector<int64_t> moe_num_experts(torch::nn::Module& module) {
  std::vector<int64_t> out;
  for (const auto& l : expert_layers(module)) {
    out.push_back(l.moe ? l.moe->options().num_experts : l.token_choice->num_experts());
  }
  return out;
}

int count_expert_optimizer_files(const std::string& tag_dir, int mp_rank) {
  int n = 0;
  while (file_exists(tag_dir + "/" + expert_optimizer_file_name(n, mp_rank))) ++n;
  return n;
}

}  // namespace deepspeed::runtime

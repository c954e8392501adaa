#include "compression/layer_state.h"

#include <mutex>
#include <regex>
#include <unordered_map>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>

#include "deepspeed/errors.h"
#include "util/check.h"

namespace deepspeed::compression {
namespace {

std::mutex& states_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const torch::nn::Module*, std::shared_ptr<LayerState>>& states() {
  static std::unordered_map<const torch::nn::Module*, std::shared_ptr<LayerState>> s;
  return s;
}

}  // namespace

at::Tensor& LayerState::weight() const {
  return linear ? linear->weight : embedding ? embedding->weight : conv->weight;
}

bool LayerState::training() const { return module.lock()->is_training(); }

std::shared_ptr<LayerState> find_layer_state(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(states_mutex());
  auto it = states().find(module);
  if (it == states().end()) return nullptr;
  if (it->second->module.expired()) {  // a new module at the address of a destroyed one
    states().erase(it);
    return nullptr;
  }
  return it->second;
}

std::shared_ptr<LayerState> layer_state(const std::shared_ptr<torch::nn::Module>& module,
                                        const std::string& name) {
  if (auto found = find_layer_state(module.get())) return found;
  auto state = std::make_shared<LayerState>();
  state->name = name;
  state->module = module;
  state->linear = dynamic_cast<torch::nn::LinearImpl*>(module.get());
  state->embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module.get());
  state->conv = dynamic_cast<torch::nn::Conv2dImpl*>(module.get());
  DS_CHECK(state->linear || state->embedding || state->conv, UsageError, "compression: ", name,
           " is not a Linear, Embedding or Conv2d layer");
  std::lock_guard<std::mutex> lock(states_mutex());
  states()[module.get()] = state;
  return state;
}

bool is_compressible(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::LinearImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::EmbeddingImpl*>(&module) != nullptr ||
         dynamic_cast<const torch::nn::Conv2dImpl*>(&module) != nullptr || is_batch_norm(module);
}

bool is_batch_norm(const torch::nn::Module& module) {
  return dynamic_cast<const torch::nn::BatchNorm2dImpl*>(&module) != nullptr;
}

std::vector<std::string> matching_layers(const torch::nn::Module& model,
                                         const std::string& pattern, const std::string& what,
                                         bool related) {
  std::optional<std::regex> re;
  if (pattern != "*") {
    try {
      re.emplace(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw ConfigError("compression_training." + what + ": the module pattern \"" + pattern +
                        "\" is not a valid regular expression (" + e.what() + ")");
    }
  }
  std::vector<std::string> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const std::string& name = item.key();
    if (re && !std::regex_search(name, *re)) continue;
    const torch::nn::Module& m = *item.value();
    // DeepSpeed fails on it too (its BNLayer_Compress has no technique of its own).
    if (is_batch_norm(m) && !related) {
      throw ConfigError("compression_training." + what + ": " + name + " is a BatchNorm2d " +
                        "layer, which shrinks only as a related module of channel pruning");
    }
    if (is_compressible(m)) out.push_back(name);
  }
  return out;
}

std::vector<std::vector<std::string>> group_layers(const torch::nn::Module& model,
                                                   const std::string& technique,
                                                   const GroupConfig& group,
                                                   std::set<std::string>& seen, bool strict) {
  const std::string what = technique + ".different_groups." + group.name;
  std::vector<std::vector<std::string>> out;
  for (const std::string& pattern : group.modules) {
    std::vector<std::string> names;
    for (const std::string& name : matching_layers(model, pattern, what)) {
      if (!seen.insert(name).second) {
        if (strict) {
          throw ConfigError("compression_training." + what + ": " + name +
                            " is already added to " + technique +
                            " (each layer belongs to one group of a technique)");
        }
        continue;
      }
      names.push_back(name);
    }
    out.push_back(std::move(names));
  }
  return out;
}

std::shared_ptr<torch::nn::Module> module_named(const torch::nn::Module& model,
                                                const std::string& name, const std::string& why) {
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (item.key() == name) return item.value();
  }
  throw ConfigError(why + ": the model has no module " + name);
}

}  // namespace deepspeed::compression

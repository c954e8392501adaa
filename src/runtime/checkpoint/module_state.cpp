// A torch::nn::Module's state dict in PyTorch's key order, and loading one back with
// load_state_dict's strict/missing/unexpected semantics. Undefined (None) parameters and
// buffers are skipped, as PyTorch's state_dict skips None, and so are sharded LoRA base weights.
#include <set>
#include <sstream>

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "deepspeed/checkpoint.h"
#include "deepspeed/linear.h"
#include "util/check.h"

namespace deepspeed::checkpoint {
namespace {

// nn.Module._save_to_state_dict order: own parameters, own buffers, then each child.
void collect(const torch::nn::Module& module, const std::string& prefix, TensorDict* state,
             std::vector<std::string>* buffers) {
  if (state) {
    for (const auto& p : module.named_parameters(/*recurse=*/false)) {
      // A base weight sharded over the ranks (deepspeed::linear) is the frozen pretrained
      // weight, loaded from the model file; rank 0's shard alone would resume no other rank.
      if (p.value().defined() && !linear::is_sharded_base_weight(p.value())) {
        state->insert(prefix + p.key(), p.value().detach());
      }
    }
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    if (!b.value().defined()) continue;
    if (state) state->insert(prefix + b.key(), b.value().detach());
    if (buffers) buffers->push_back(prefix + b.key());
  }
  for (const auto& child : module.named_children()) {
    collect(*child.value(), prefix + child.key() + ".", state, buffers);
  }
}

std::string join(const std::vector<std::string>& names) {
  std::ostringstream os;
  for (size_t i = 0; i < names.size(); ++i) os << (i ? ", " : "") << '"' << names[i] << '"';
  return os.str();
}

}  // namespace

TensorDict module_state_dict(const torch::nn::Module& module) {
  TensorDict state;
  collect(module, "", &state, nullptr);
  return state;
}

std::vector<std::string> module_buffer_names(const torch::nn::Module& module) {
  std::vector<std::string> names;
  collect(module, "", nullptr, &names);
  return names;
}

LoadStateResult load_module_state_dict(torch::nn::Module& module, const TensorDict& state,
                                       bool strict, const std::string& source) {
  TensorDict targets = module_state_dict(module);
  LoadStateResult result;
  std::vector<std::string> shape_errors;
  for (const auto& target : targets) {
    const at::Tensor* saved = state.find(target.key());
    if (saved == nullptr) {
      result.missing_keys.push_back(target.key());
      continue;
    }
    if (!saved->sizes().equals(target.value().sizes())) {
      std::ostringstream os;
      os << target.key() << ": checkpoint shape " << saved->sizes() << ", model shape "
         << target.value().sizes();
      shape_errors.push_back(os.str());
    }
  }
  for (const auto& item : state) {
    if (!targets.contains(item.key())) result.unexpected_keys.push_back(item.key());
  }
  DS_CHECK(shape_errors.empty(), CheckpointError, source, ": size mismatch for ",
           join(shape_errors));
  DS_CHECK(!strict || (result.missing_keys.empty() && result.unexpected_keys.empty()),
           CheckpointError, source, ": error loading the module state dict: missing keys [",
           join(result.missing_keys), "], unexpected keys [", join(result.unexpected_keys),
           "]; load with load_module_strict=false to ignore them");
  at::NoGradGuard no_grad;
  for (auto& target : targets) {
    const at::Tensor* saved = state.find(target.key());
    if (saved) target.value().copy_(*saved);  // the detached view writes into the module
  }
  return result;
}

}  // namespace deepspeed::checkpoint

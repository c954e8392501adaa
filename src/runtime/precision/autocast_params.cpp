// torch_autocast's set-up in the engine (see the header).
#include "runtime/precision/autocast_params.h"

#include <algorithm>
#include <set>

#include "deepspeed/autocast.h"
#include "util/check.h"

namespace deepspeed::runtime {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// "a.b.C" and "a::b::CImpl" both become "a::b::C"; torch.nn's module paths
// ("torch.nn.modules.linear.Linear") become the public name ("torch::nn::Linear").
std::string canonical_class(std::string name) {
  for (size_t at = name.find('.'); at != std::string::npos; at = name.find('.', at + 2)) {
    name.replace(at, 1, "::");
  }
  if (ends_with(name, "Impl")) name.resize(name.size() - 4);
  const std::string torch_nn = "torch::nn::";
  if (name.rfind(torch_nn, 0) == 0) {
    const size_t last = name.rfind("::");
    name = torch_nn + name.substr(last + 2);
  }
  return name;
}

}  // namespace

const std::vector<std::string>& default_lower_precision_safe_modules() {
  // Matches DeepSpeed's LOWER_PRECISION_SAFE_MODULES, as "module.Class" strings.
  static const std::vector<std::string> names = {
      "torch.nn.modules.linear.Linear", "torch.nn.modules.conv.Conv1d",
      "torch.nn.modules.conv.Conv2d", "torch.nn.modules.conv.Conv3d"};
  return names;
}

at::ScalarType torch_autocast_dtype(const DeepSpeedConfig& config, c10::DeviceType device) {
  const std::string& d = config.torch_autocast.dtype;
  const at::ScalarType dtype = d == "fp16"   ? at::kHalf
                               : d == "bf16" ? at::kBFloat16
                                             : default_autocast_dtype(device);
  DS_CHECK(autocast_supported(device, dtype), ConfigError, config.source,
           ": torch_autocast.dtype is ", dtype, " but this LibTorch has no ", dtype,
           " autocast on ", device,
           " (its CPU autocast runs BFloat16 only; LibTorch 2.x adds Half)");
  return dtype;
}

bool names_module_class(const std::string& configured, const std::string& type_name) {
  return canonical_class(configured) == canonical_class(type_name);
}

CommDtypes autocast_comm_dtypes(torch::nn::Module& model, const DeepSpeedConfig& config,
                                at::ScalarType dtype, std::vector<std::string>* unmatched) {
  const auto section = config.raw.find("torch_autocast");
  const bool defaults = section == config.raw.end() || !section->is_object() ||
                        !section->contains("lower_precision_safe_modules");
  const std::vector<std::string>& names =
      defaults ? default_lower_precision_safe_modules()
               : config.torch_autocast.lower_precision_safe_modules;
  std::set<std::string> used;
  CommDtypes marked;
  model.apply([&](torch::nn::Module& module) {
    const std::string type = module.name();
    auto named = std::find_if(names.begin(), names.end(),
                              [&](const std::string& n) { return names_module_class(n, type); });
    if (named == names.end()) return;
    used.insert(*named);
    for (const auto& p : module.parameters(/*recurse=*/false)) {
      marked[p.unsafeGetTensorImpl()] = dtype;
    }
  });
  if (unmatched != nullptr && !defaults) {
    for (const auto& n : names) {
      if (!used.count(n)) unmatched->push_back(n);
    }
  }
  return marked;
}

}  // namespace deepspeed::runtime

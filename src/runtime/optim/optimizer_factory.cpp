// Optimizer construction from a resolved config section and the model's param groups.
#include "runtime/optim/optimizer_factory.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <unordered_map>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "deepspeed/muon.h"
#include "deepspeed/optimizers.h"
#include "runtime/optim/optimizer_params.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

using torch::optim::OptimizerParamGroup;

template <typename TorchOptions>
std::unique_ptr<TorchOptions> torch_adam_options(const GroupOptions& g) {
  auto o = std::make_unique<TorchOptions>(g.get_lr());
  auto [b1, b2] = g.pair("betas");
  o->betas({b1, b2}).eps(g.number("eps")).weight_decay(g.number("weight_decay"));
  o->amsgrad(g.flag("amsgrad"));
  return o;
}

template <typename TorchOptimizer, typename TorchOptions>
std::unique_ptr<torch::optim::Optimizer> make_torch_adam(std::vector<OptimizerParamGroup> groups,
                                                         const std::vector<GroupOptions>& options,
                                                         const GroupOptions& defaults) {
  for (size_t i = 0; i < groups.size(); ++i) {
    groups[i].set_options(torch_adam_options<TorchOptions>(options[i]));
  }
  return std::make_unique<TorchOptimizer>(std::move(groups),
                                          *torch_adam_options<TorchOptions>(defaults));
}

// Matches DeepSpeed's set_optimizer_flags: Muon for matrices whose name mentions neither an
// embedding nor the output head.
bool muon_by_name(const at::Tensor& p, const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return p.dim() >= 2 && lower.find("embed") == std::string::npos &&
         lower.find("lm_head") == std::string::npos;
}

// DeepSpeed's _muon_param_groups: each incoming group split into its Muon and Adam halves
// ("<prefix>-muon-params", "<prefix>-adam-params"), each half resolved by resolve_muon_half.
// A group's "use_muon" (ours: C++ parameters carry no attributes) puts all of it in one half.
std::unique_ptr<torch::optim::Optimizer> build_muon(const OptimizerSpec& spec,
                                                    const OptimizerConfig& config,
                                                    const std::vector<ParamGroup>& groups,
                                                    const std::string& source,
                                                    const OptimizerBuildOptions& options) {
  std::vector<OptimizerParamGroup> torch_groups;
  size_t listed = 0;
  for (const auto& g : groups) listed += g.params.empty() ? 0 : 1;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = source + ": param group " + std::to_string(g) + ": ";
    const json& overrides = groups[g].options;
    std::optional<bool> forced;
    std::string prefix = listed > 1 ? "group" + std::to_string(g) : "";
    if (overrides.is_object()) {
      if (auto it = overrides.find("use_muon"); it != overrides.end() && !it->is_null()) {
        DS_CHECK(it->is_boolean(), ConfigError, where, "use_muon is ", it->dump(),
                 "; expected true or false");
        forced = it->get<bool>();
      }
      if (auto it = overrides.find("name"); it != overrides.end() && !it->is_null()) {
        DS_CHECK(it->is_string(), ConfigError, where, "name is ", it->dump(),
                 "; expected a string");
        prefix = it->get<std::string>();
      }
    }
    std::vector<at::Tensor> halves[2];  // [0]: Adam, [1]: Muon
    for (const auto& p : groups[g].params) {
      if (!p.requires_grad()) continue;
      bool use_muon = false;
      if (forced) {
        use_muon = *forced;
      } else {
        auto name = options.param_names.find(p.unsafeGetTensorImpl());
        DS_CHECK(name != options.param_names.end(), ConfigError, where, "a parameter of shape ",
                 p.sizes(), " is not one of the model's; Muon chooses its half by the "
                 "parameter's name (as DeepSpeed's use_muon tags), so pass it as part of the "
                 "model or give its param group \"use_muon\": true or false");
        use_muon = muon_by_name(p, name->second);
      }
      halves[use_muon ? 1 : 0].push_back(p);
    }
    for (bool use_muon : {true, false}) {
      auto& params = halves[use_muon ? 1 : 0];
      if (params.empty()) continue;
      GroupOptions o;
      const std::string label = use_muon ? "muon-params" : "adam-params";
      o.set("use_muon", use_muon).set("name", prefix.empty() ? label : prefix + "-" + label);
      const GroupOptions half = resolve_muon_half(config, use_muon, overrides, where);
      for (const auto& [key, value] : half.items()) o.set(key, value);
      torch_groups.emplace_back(std::move(params), std::make_unique<GroupOptions>(o));
    }
  }
  DS_CHECK(!torch_groups.empty(), UsageError, source, ": optimizer ", config.type,
           " has no parameters to train (every param group is empty)");
  return std::make_unique<Muon>(std::move(torch_groups), spec.adam_w_mode);
}

}  // namespace

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<ParamGroup>& groups,
                                                         const std::string& source,
                                                         const OptimizerBuildOptions& options) {
  const OptimizerSpec spec = resolve_optimizer(config, source, options.offload);
  if (spec.kind == OptimizerKind::kMuon) return build_muon(spec, config, groups, source, options);

  std::vector<OptimizerParamGroup> torch_groups;
  std::vector<GroupOptions> group_options;
  std::vector<std::pair<size_t, at::Tensor>> masks;  // (optimizer group, exp_avg_mask)
  // Parameter -> (group, position), to name both places of a parameter listed twice.
  std::unordered_map<const c10::TensorImpl*, std::pair<size_t, size_t>> seen;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::string where = source + ": param group " + std::to_string(g) + ": ";
    const auto& params = groups[g].params;
    for (size_t i = 0; i < params.size(); ++i) {
      DS_CHECK(params[i].defined(), ConfigError, where, "parameter ", i, " is undefined");
      auto [it, fresh] = seen.emplace(params[i].unsafeGetTensorImpl(), std::make_pair(g, i));
      DS_CHECK(fresh, ConfigError, where, "parameter ", i, " is also parameter ",
               it->second.second, " of param group ", it->second.first,
               "; a parameter may appear in one param group only");
    }
    if (params.empty()) continue;  // Matches DeepSpeed: empty groups are dropped
    group_options.push_back(resolve_group_options(spec, groups[g].options, where, options.offload));
    if (const at::Tensor& mask = groups[g].exp_avg_mask; mask.defined()) {
      DS_CHECK(spec.kind == OptimizerKind::kOneBitAdam || spec.kind == OptimizerKind::kZeroOneAdam ||
                   spec.kind == OptimizerKind::kOneBitLamb,
               ConfigError, where, "exp_avg_mask is a param-group key of the 1-bit optimizers "
               "(OneBitAdam, ZeroOneAdam, OneBitLamb); optimizer.type is \"", config.type, "\"");
      for (size_t i = 0; i < params.size(); ++i) {
        DS_CHECK(mask.numel() == params[i].numel(), ConfigError, where, "exp_avg_mask has ",
                 mask.numel(), " elements (shape ", mask.sizes(), ") but parameter ", i,
                 " has ", params[i].numel(), " (shape ", params[i].sizes(),
                 "); the mask multiplies each parameter's momentum, so give a masked parameter "
                 "a param group of its own");
      }
      masks.emplace_back(torch_groups.size(), mask);
    }
    torch_groups.emplace_back(params, std::make_unique<GroupOptions>(group_options.back()));
  }
  DS_CHECK(!torch_groups.empty(), UsageError, source, ": optimizer ", config.type,
           " has no parameters to train (every param group is empty)");

  std::unique_ptr<torch::optim::Optimizer> opt;
  switch (spec.kind) {
    case OptimizerKind::kAdam:
      if (spec.torch_adam) {
        if (spec.adam_w_mode) {
          return make_torch_adam<torch::optim::AdamW, torch::optim::AdamWOptions>(
              std::move(torch_groups), group_options, spec.defaults);
        }
        return make_torch_adam<torch::optim::Adam, torch::optim::AdamOptions>(
            std::move(torch_groups), group_options, spec.defaults);
      }
      opt = std::make_unique<Adam>(std::move(torch_groups), AdamOptions{}, spec.adam_w_mode);
      break;
    case OptimizerKind::kLamb:
      opt = std::make_unique<Lamb>(std::move(torch_groups), LambOptions{}, spec.eps_inside_sqrt);
      break;
    case OptimizerKind::kLion:
      opt = std::make_unique<Lion>(std::move(torch_groups), LionOptions{});
      break;
    case OptimizerKind::kAdagrad:
      opt = std::make_unique<Adagrad>(std::move(torch_groups), AdagradOptions{}, options.offload);
      break;
    case OptimizerKind::kSGD:
      opt = std::make_unique<SGD>(std::move(torch_groups), SGDOptions{});
      break;
    case OptimizerKind::kOneBitAdam:
      opt = std::make_unique<onebit::OneBitAdam>(std::move(torch_groups), spec.defaults,
                                                 spec.onebit);
      break;
    case OptimizerKind::kOneBitLamb:
      opt = std::make_unique<onebit::OneBitLamb>(std::move(torch_groups), spec.defaults,
                                                 spec.onebit);
      break;
    case OptimizerKind::kZeroOneAdam:
      opt = std::make_unique<onebit::ZeroOneAdam>(std::move(torch_groups), spec.defaults,
                                                  spec.onebit);
      break;
    case OptimizerKind::kMuon:
      DS_INTERNAL_ASSERT(false, "Muon is built by build_muon");
  }
  // Python's defaults are the constructor's kwargs, i.e. optimizer.params: a group added later
  // without options gets them.
  static_cast<GroupOptions&>(opt->defaults()) = spec.defaults;
  if (auto* cc = dynamic_cast<onebit::CompressedCommunication*>(opt.get())) {
    for (auto& [g, mask] : masks) cc->set_exp_avg_mask(g, mask);
  }
  return opt;
}

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<at::Tensor>& params,
                                                         const std::string& source) {
  return build_optimizer(config, {ParamGroup{params}}, source, OptimizerBuildOptions{});
}

void check_optimizer_supported(const OptimizerConfig& config, const std::string& source) {
  (void)resolve_optimizer(config, source, std::nullopt);
}

bool is_zero_supported_optimizer(const torch::optim::Optimizer& optimizer) {
  const auto* o = &optimizer;
  return dynamic_cast<const Adam*>(o) != nullptr || dynamic_cast<const Adagrad*>(o) != nullptr ||
         dynamic_cast<const Lion*>(o) != nullptr || dynamic_cast<const Muon*>(o) != nullptr ||
         dynamic_cast<const torch::optim::Adam*>(o) != nullptr ||
         dynamic_cast<const torch::optim::AdamW*>(o) != nullptr ||
         dynamic_cast<const torch::optim::Adagrad*>(o) != nullptr;
}

double configured_lr(const OptimizerConfig& config, const std::string& source) {
  return resolve_optimizer(config, source, std::nullopt).defaults.get_lr();
}

AdamParams parse_adam_params(const OptimizerConfig& config, const std::string& source) {
  const OptimizerSpec spec = resolve_optimizer(config, source, std::nullopt);
  DS_CHECK(spec.kind == OptimizerKind::kAdam, ConfigError, source, ": optimizer.type \"",
           config.type, "\" is not Adam or AdamW");
  AdamParams p;
  const GroupOptions& g = spec.defaults;
  p.lr = g.get_lr();
  std::tie(p.beta1, p.beta2) = g.pair("betas");
  p.eps = g.number("eps");
  p.weight_decay = g.number("weight_decay");
  p.adam_w_mode = spec.adam_w_mode;
  p.bias_correction = spec.torch_adam || g.flag("bias_correction");
  p.torch_adam = spec.torch_adam;
  return p;
}

}  // namespace deepspeed::optim

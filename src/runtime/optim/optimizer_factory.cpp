// Optimizer selection from ds_config. Adam/AdamW run on torch::optim for now (same update as
// DeepSpeed's FusedAdam/CPU-Adam, see reference §3.2); the fused CPU-Adam comes with issue 9.
#include "runtime/optim/optimizer_factory.h"

#include <algorithm>
#include <cctype>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include "util/check.h"

namespace deepspeed::optim {
namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// DeepSpeed's own optimizer names (matched case-insensitively).
constexpr const char* kDeepSpeedNames[] = {"adam",  "adamw", "lamb",  "onebitadam",
                                           "zerooneadam", "onebitlamb", "adagrad", "lion",
                                           "muadam", "muadamw", "musgd", "muon"};
// torch.optim class names DeepSpeed falls back to (case-sensitive, as in Python).
constexpr const char* kTorchNames[] = {"SGD",  "Adadelta", "Adagrad", "Adamax", "ASGD",
                                       "LBFGS", "NAdam", "RAdam", "RMSprop", "Rprop", "SparseAdam"};

double number(const json& v, const std::string& where) {
  DS_CHECK(v.is_number(), ConfigError, where, " is ", v.dump(), "; expected a number");
  return v.get<double>();
}

bool boolean(const json& v, const std::string& where) {
  DS_CHECK(v.is_boolean(), ConfigError, where, " is ", v.dump(), "; expected true or false");
  return v.get<bool>();
}

}  // namespace

AdamParams parse_adam_params(const OptimizerConfig& config, const std::string& source) {
  AdamParams p;
  const std::string type = lower(config.type);
  const std::string base = source + ": optimizer.params.";
  for (auto it = config.params.begin(); it != config.params.end(); ++it) {
    const std::string& k = it.key();
    const json& v = it.value();
    if (v.is_string() && v.get<std::string>() == "auto") continue;
    if (k == "lr") {
      p.lr = number(v, base + k);
    } else if (k == "betas") {
      DS_CHECK(v.is_array() && v.size() == 2, ConfigError, base, k, " is ", v.dump(),
               "; expected two numbers [beta1, beta2]");
      p.beta1 = number(v[0], base + "betas[0]");
      p.beta2 = number(v[1], base + "betas[1]");
    } else if (k == "eps") {
      p.eps = number(v, base + k);
    } else if (k == "weight_decay") {
      p.weight_decay = number(v, base + k);
    } else if (k == "adam_w_mode") {
      p.adam_w_mode = boolean(v, base + k);
    } else if (k == "bias_correction") {
      p.bias_correction = boolean(v, base + k);
    } else if (k == "torch_adam") {
      p.torch_adam = boolean(v, base + k);
    } else if (k == "amsgrad") {
      DS_CHECK(!boolean(v, base + k), ConfigError, base, k,
               " is true; DeepSpeed's Adam does not support amsgrad");
    } else if (k == "fp32_optimizer_states" || k == "set_grad_none" || k == "capturable") {
      // Accepted by DeepSpeed's Adam variants; no effect on the fp32 torch path.
    } else {
      throw ConfigError(base + k + " is not a parameter of " + config.type +
                        " (known: lr, betas, eps, weight_decay, adam_w_mode, bias_correction, "
                        "torch_adam, amsgrad)");
    }
  }
  // Matches DeepSpeed: "AdamW" is always decoupled; "Adam" is unless adam_w_mode is false.
  if (type == "adamw") p.adam_w_mode = true;
  DS_CHECK(p.lr >= 0, ConfigError, base, "lr is ", p.lr, "; expected >= 0");
  DS_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1, ConfigError, base,
           "betas are [", p.beta1, ", ", p.beta2, "]; each must be in [0, 1)");
  DS_CHECK(p.eps >= 0, ConfigError, base, "eps is ", p.eps, "; expected >= 0");
  return p;
}

void check_optimizer_supported(const OptimizerConfig& config, const std::string& source) {
  const std::string type = lower(config.type);
  if (type == "adam" || type == "adamw") {
    AdamParams p = parse_adam_params(config, source);
    DS_CHECK(p.bias_correction, NotSupportedError, source,
             ": optimizer.params.bias_correction false is not supported yet");
    return;
  }
  for (const char* n : kDeepSpeedNames) {
    DS_CHECK(type != n, NotSupportedError, source, ": optimizer.type \"", config.type,
             "\" is not supported yet (supported: Adam, AdamW)");
  }
  for (const char* n : kTorchNames) {
    DS_CHECK(config.type != n, NotSupportedError, source, ": optimizer.type \"", config.type,
             "\" (torch.optim) is not supported yet (supported: Adam, AdamW)");
  }
  throw ConfigError(source + ": optimizer.type \"" + config.type +
                    "\" is not a supported DeepSpeed optimizer nor a torch.optim class");
}

std::unique_ptr<torch::optim::Optimizer> build_optimizer(const OptimizerConfig& config,
                                                         const std::vector<at::Tensor>& params,
                                                         const std::string& source) {
  check_optimizer_supported(config, source);
  AdamParams p = parse_adam_params(config, source);
  if (p.adam_w_mode) {
    auto o = torch::optim::AdamWOptions(p.lr)
                 .betas({p.beta1, p.beta2})
                 .eps(p.eps)
                 .weight_decay(p.weight_decay);
    return std::make_unique<torch::optim::AdamW>(params, o);
  }
  auto o = torch::optim::AdamOptions(p.lr)
               .betas({p.beta1, p.beta2})
               .eps(p.eps)
               .weight_decay(p.weight_decay);
  return std::make_unique<torch::optim::Adam>(params, o);
}

}  // namespace deepspeed::optim

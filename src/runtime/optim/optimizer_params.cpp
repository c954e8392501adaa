// optimizer.type and optimizer.params resolved as DeepSpeed's _configure_basic_optimizer does
// (reference §3.1): DeepSpeed names case-insensitively, then torch.optim class names
// case-sensitively; params are the constructor's keyword arguments, so a key the selected class
// does not take is an error, as Python's TypeError would be.
#include "runtime/optim/optimizer_params.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "config/json_reader.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

constexpr const char* kSupported = "Adam, AdamW, Lamb, Lion, Adagrad, SGD";
// torch.optim classes DeepSpeed would fall back to (by attribute name, case-sensitive).
constexpr const char* kTorchOptimNames[] = {"Adadelta", "Adafactor", "Adagrad", "Adam",
                                            "Adamax",   "AdamW",     "ASGD",    "LBFGS",
                                            "NAdam",    "RAdam",     "RMSprop", "Rprop",
                                            "SGD",      "SparseAdam"};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// How a keyword argument is handled.
enum class Rule {
  kNumber,       // a hyper-parameter in the group
  kFlag,         // a boolean hyper-parameter in the group
  kPair,         // betas
  kInert,        // accepted; selects an implementation in Python, no effect on the update
  kMustBeFalse,  // only false is implemented; true is refused with `refusal`
  kMustBeTrue,   // only true is implemented
  kWideFlag,     // an optimizer-wide boolean, read by resolve_optimizer; not in param groups
};
// Which of DeepSpeed's classes takes the key: its CPU optimizer (offload_optimizer on) or the
// other one.
enum class Avail { kAlways, kOffloadOnly, kNoOffloadOnly };

struct KeyRule {
  const char* key;
  Rule rule;
  Avail avail = Avail::kAlways;
  const char* refusal = nullptr;
  bool refusal_is_not_supported = false;  // NotSupportedError (else ConfigError)
};

constexpr const char* kFp32States =
    "16-bit optimizer states for DeepSpeed's CPU optimizers are not supported yet";

const std::vector<KeyRule>& rules_for(const OptimizerSpec& spec) {
  static const std::vector<KeyRule> adam = {
      {"lr", Rule::kNumber},
      {"bias_correction", Rule::kFlag},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"weight_decay", Rule::kNumber},
      {"adam_w_mode", Rule::kWideFlag},
      {"torch_adam", Rule::kWideFlag},
      {"amsgrad", Rule::kMustBeFalse, Avail::kAlways,
       "DeepSpeed's Adam (FusedAdam, DeepSpeedCPUAdam) does not support amsgrad; torch_adam: "
       "true selects torch.optim's, which does"},
      {"set_grad_none", Rule::kInert, Avail::kNoOffloadOnly},
      {"fp32_optimizer_states", Rule::kMustBeTrue, Avail::kOffloadOnly, kFp32States, true},
  };
  static const std::vector<KeyRule> torch_adam = {
      {"lr", Rule::kNumber},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"weight_decay", Rule::kNumber},
      {"amsgrad", Rule::kFlag},
      {"adam_w_mode", Rule::kWideFlag},
      {"torch_adam", Rule::kWideFlag},
      {"foreach", Rule::kInert},
      {"capturable", Rule::kInert},
      {"fused", Rule::kInert},
      {"maximize", Rule::kMustBeFalse, Avail::kAlways, "LibTorch's Adam cannot maximize", true},
      {"differentiable", Rule::kMustBeFalse, Avail::kAlways,
       "differentiable optimizer steps are not supported", true},
  };
  static const std::vector<KeyRule> lamb = {
      {"lr", Rule::kNumber},
      {"bias_correction", Rule::kFlag},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"eps_inside_sqrt", Rule::kWideFlag},
      {"weight_decay", Rule::kNumber},
      {"max_coeff", Rule::kNumber},
      {"min_coeff", Rule::kNumber},
      {"amsgrad", Rule::kMustBeFalse, Avail::kAlways, "FusedLamb does not support amsgrad"},
  };
  static const std::vector<KeyRule> lion = {
      {"lr", Rule::kNumber},
      {"betas", Rule::kPair},
      {"weight_decay", Rule::kNumber},
      {"set_grad_none", Rule::kInert, Avail::kNoOffloadOnly},
      {"fp32_optimizer_states", Rule::kMustBeTrue, Avail::kOffloadOnly, kFp32States, true},
  };
  static const std::vector<KeyRule> adagrad = {
      {"lr", Rule::kNumber},
      {"lr_decay", Rule::kNumber, Avail::kNoOffloadOnly},
      {"eps", Rule::kNumber},
      {"weight_decay", Rule::kNumber},
      {"initial_accumulator_value", Rule::kNumber, Avail::kNoOffloadOnly},
      {"maximize", Rule::kFlag, Avail::kNoOffloadOnly},
      {"foreach", Rule::kInert, Avail::kNoOffloadOnly},
      {"fused", Rule::kInert, Avail::kNoOffloadOnly},
      {"differentiable", Rule::kMustBeFalse, Avail::kNoOffloadOnly,
       "differentiable optimizer steps are not supported", true},
      {"amsgrad", Rule::kMustBeFalse, Avail::kOffloadOnly,
       "DeepSpeedCPUAdagrad does not implement amsgrad"},
      {"fp32_optimizer_states", Rule::kMustBeTrue, Avail::kOffloadOnly, kFp32States, true},
  };
  static const std::vector<KeyRule> sgd = {
      {"lr", Rule::kNumber},
      {"momentum", Rule::kNumber},
      {"dampening", Rule::kNumber},
      {"weight_decay", Rule::kNumber},
      {"nesterov", Rule::kFlag},
      {"maximize", Rule::kFlag},
      {"foreach", Rule::kInert},
      {"fused", Rule::kInert},
      {"differentiable", Rule::kMustBeFalse, Avail::kAlways,
       "differentiable optimizer steps are not supported", true},
  };
  switch (spec.kind) {
    case OptimizerKind::kAdam: return spec.torch_adam ? torch_adam : adam;
    case OptimizerKind::kLamb: return lamb;
    case OptimizerKind::kLion: return lion;
    case OptimizerKind::kAdagrad: return adagrad;
    case OptimizerKind::kSGD: return sgd;
  }
  DS_INTERNAL_ASSERT(false, "unknown optimizer kind");
}

bool available(Avail avail, std::optional<bool> offload) {
  if (!offload) return true;
  if (avail == Avail::kOffloadOnly) return *offload;
  if (avail == Avail::kNoOffloadOnly) return !*offload;
  return true;
}

// null leaves the default (Python's None for a keyword argument with a default).
bool is_unset(const json& v) { return v.is_null(); }

// "auto" is Hugging Face's placeholder for a value its integration fills in; no number can be
// derived here, so it is refused by key rather than silently trained with the default.
void refuse_auto(const json& v, const std::string& where, const char* expected) {
  DS_CHECK(!config_detail::is_auto(v), ConfigError, where, " ",
           config_detail::auto_placeholder_message(expected));
}

double number(const json& v, const std::string& where) {
  refuse_auto(v, where, "a number");
  DS_CHECK(v.is_number(), ConfigError, where, " is ", v.dump(), "; expected a number");
  return v.get<double>();
}

bool boolean(const json& v, const std::string& where) {
  refuse_auto(v, where, "true or false");
  DS_CHECK(v.is_boolean(), ConfigError, where, " is ", v.dump(), "; expected true or false");
  return v.get<bool>();
}

std::pair<double, double> number_pair(const json& v, const std::string& where) {
  refuse_auto(v, where, "two numbers [beta1, beta2]");
  DS_CHECK(v.is_array() && v.size() == 2, ConfigError, where, " is ", v.dump(),
           "; expected two numbers [beta1, beta2]");
  return {number(v[0], where + "[0]"), number(v[1], where + "[1]")};
}

// Applies the keyword arguments in `params` to `group`. `base` prefixes each key in messages.
void apply_params(const OptimizerSpec& spec, const json& params, GroupOptions& group,
                  const std::string& base, std::optional<bool> offload, bool in_param_group) {
  const auto& rules = rules_for(spec);
  for (auto it = params.begin(); it != params.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    const std::string where = base + key;
    // Matches DeepSpeed's engine, which raises ValueError when it builds the optimizer.
    DS_CHECK(key != "max_grad_norm", ConfigError, where,
             " is not supported as an optimizer parameter (DeepSpeed raises ValueError for it "
             "too); remove it and set the top-level \"gradient_clipping\" instead");
    auto rule = std::find_if(rules.begin(), rules.end(),
                             [&](const KeyRule& r) { return key == r.key; });
    if (rule == rules.end()) {
      std::string known;
      for (const auto& r : rules) {
        if (available(r.avail, offload)) known += (known.empty() ? "" : ", ") + std::string(r.key);
      }
      throw ConfigError(where + " is not a parameter of " + spec.type + " (known: " + known + ")");
    }
    DS_CHECK(available(rule->avail, offload), ConfigError, where, " is not a parameter of ",
             spec.type,
             rule->avail == Avail::kOffloadOnly
                 ? " without zero_optimization.offload_optimizer (only DeepSpeed's CPU optimizer "
                   "takes it)"
                 : " with zero_optimization.offload_optimizer (DeepSpeed's CPU optimizer does "
                   "not take it)");
    if (is_unset(v)) continue;
    switch (rule->rule) {
      case Rule::kNumber: group.set(key, number(v, where)); break;
      case Rule::kFlag: group.set(key, boolean(v, where)); break;
      case Rule::kPair: group.set(key, number_pair(v, where)); break;
      case Rule::kInert: refuse_auto(v, where, "a value"); break;
      case Rule::kMustBeFalse:
      case Rule::kMustBeTrue: {
        const bool wanted = rule->rule == Rule::kMustBeTrue;
        if (boolean(v, where) == wanted) break;
        std::string msg = where + " is " + (wanted ? "false" : "true") + "; " + rule->refusal;
        if (rule->refusal_is_not_supported) throw NotSupportedError(msg);
        throw ConfigError(msg);
      }
      case Rule::kWideFlag:
        DS_CHECK(!in_param_group, ConfigError, where,
                 " applies to the whole optimizer; set it in optimizer.params, not in a param "
                 "group");
        boolean(v, where);
        break;
    }
  }
}

void check_values(const OptimizerSpec& spec, const GroupOptions& g, const std::string& base) {
  auto at_least_zero = [&](const char* key) {
    if (!g.has(key)) return;
    DS_CHECK(g.number(key) >= 0.0, ConfigError, base, key, " is ", g.number(key),
             "; expected >= 0");
  };
  for (const char* key : {"lr", "eps", "weight_decay", "momentum", "lr_decay",
                          "initial_accumulator_value"}) {
    at_least_zero(key);
  }
  if (g.has("betas")) {
    auto [b1, b2] = g.pair("betas");
    DS_CHECK(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1, ConfigError, base, "betas are [", b1, ", ",
             b2, "]; each must be in [0, 1)");
  }
  if (spec.kind == OptimizerKind::kSGD && g.flag("nesterov")) {
    DS_CHECK(g.number("momentum") > 0 && g.number("dampening") == 0, ConfigError, base,
             "nesterov is true; torch.optim.SGD's Nesterov momentum requires momentum > 0 and "
             "dampening 0 (momentum is ", g.number("momentum"), ", dampening ",
             g.number("dampening"), ")");
  }
}

OptimizerKind resolve_kind(const std::string& type, const std::string& source) {
  const std::string name = lower(type);
  if (name == "adam" || name == "adamw") return OptimizerKind::kAdam;
  if (name == "lamb") return OptimizerKind::kLamb;
  if (name == "lion") return OptimizerKind::kLion;
  if (name == "adagrad") return OptimizerKind::kAdagrad;
  const std::string head = source + ": optimizer.type \"" + type + "\"";
  const std::string supported = "supported: " + std::string(kSupported);
  DS_CHECK(name != "onebitadam" && name != "zerooneadam" && name != "onebitlamb",
           NotSupportedError, head, " is not supported yet (DeepSpeed's 1-bit/0-1 "
           "compressed-communication optimizers; ", supported, ")");
  DS_CHECK(name != "muadam" && name != "muadamw" && name != "musgd", NotSupportedError, head,
           " is not supported yet (muP optimizers from the mup package; ", supported, ")");
  DS_CHECK(name != "muon", NotSupportedError, head, " is not supported yet (MuonWithAuxAdam; ",
           supported, ")");
  if (type == "SGD") return OptimizerKind::kSGD;
  std::string hint;
  for (const char* torch_name : kTorchOptimNames) {
    DS_CHECK(type != torch_name, NotSupportedError, head, " (torch.optim) is not supported yet (",
             supported, ")");
    if (lower(torch_name) == name) {
      hint = "; torch.optim class names are case-sensitive: did you mean \"" +
             std::string(torch_name) + "\"?";
    }
  }
  // DeepSpeed's own wording: "<type> is not a supported DeepSpeed Optimizer".
  throw ConfigError(head + " is not a supported DeepSpeed optimizer nor a torch.optim class "
                    "(known: " + kSupported + "; DeepSpeed's names match case-insensitively)" +
                    hint);
}

GroupOptions default_group(const OptimizerSpec& spec, std::optional<bool> offload) {
  switch (spec.kind) {
    case OptimizerKind::kAdam:
      if (spec.torch_adam) {
        // torch.optim's own defaults: AdamW decays by 0.01, Adam not at all.
        GroupOptions g;
        g.set("lr", 1e-3).set("betas", std::make_pair(0.9, 0.999)).set("eps", 1e-8);
        g.set("weight_decay", spec.adam_w_mode ? 1e-2 : 0.0).set("amsgrad", false);
        return g;
      }
      return AdamOptions{}.group();
    case OptimizerKind::kLamb: return LambOptions{}.group();
    case OptimizerKind::kLion: return LionOptions{}.group();
    case OptimizerKind::kAdagrad: return AdagradOptions{}.group(offload.value_or(false));
    case OptimizerKind::kSGD: return SGDOptions{}.group();
  }
  DS_INTERNAL_ASSERT(false, "unknown optimizer kind");
}

}  // namespace

OptimizerSpec resolve_optimizer(const OptimizerConfig& config, const std::string& source,
                                std::optional<bool> offload) {
  OptimizerSpec spec;
  spec.type = config.type;
  spec.kind = resolve_kind(config.type, source);
  const std::string base = source + ": optimizer.params.";
  const json& params = config.params.is_null() ? json::object() : config.params;
  DS_CHECK(params.is_object(), ConfigError, source, ": optimizer.params is ", params.dump(),
           "; expected an object");
  auto wide_flag = [&](const char* key, bool fallback) {
    auto it = params.find(key);
    if (it == params.end() || is_unset(*it)) return fallback;
    return boolean(*it, base + key);
  };
  if (spec.kind == OptimizerKind::kAdam) {
    spec.torch_adam = wide_flag("torch_adam", false);
    // Matches DeepSpeed: "AdamW" is always decoupled; "Adam" is unless adam_w_mode is false.
    const bool adam_w_mode = wide_flag("adam_w_mode", true);
    spec.adam_w_mode = lower(config.type) == "adamw" || adam_w_mode;
  }
  if (spec.kind == OptimizerKind::kLamb) spec.eps_inside_sqrt = wide_flag("eps_inside_sqrt", false);
  spec.defaults = default_group(spec, offload);
  apply_params(spec, params, spec.defaults, base, offload, /*in_param_group=*/false);
  check_values(spec, spec.defaults, base);
  return spec;
}

GroupOptions resolve_group_options(const OptimizerSpec& spec, const json& overrides,
                                   const std::string& where, std::optional<bool> offload) {
  GroupOptions g = spec.defaults;
  if (overrides.is_null()) return g;  // no overrides
  DS_CHECK(overrides.is_object(), ConfigError, where, "the options are ", overrides.dump(),
           "; expected an object of optimizer parameters");
  apply_params(spec, overrides, g, where, offload, /*in_param_group=*/true);
  check_values(spec, g, where);
  return g;
}

}  // namespace deepspeed::optim

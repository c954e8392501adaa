// optimizer.type and optimizer.params resolved as DeepSpeed's _configure_basic_optimizer does
// (reference §3.1): DeepSpeed names case-insensitively, then torch.optim class names
// case-sensitively; params are the constructor's keyword arguments, so a key the selected class
// does not take is an error, as Python's TypeError would be.
#include "runtime/optim/optimizer_params.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "config/json_reader.h"
#include "deepspeed/muon.h"
#include "util/check.h"

namespace deepspeed::optim {
namespace {

constexpr const char* kSupported =
    "Adam, AdamW, Lamb, Lion, Adagrad, SGD, OneBitAdam, ZeroOneAdam, OneBitLamb, Muon";
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
  kWideCount,    // an optimizer-wide integer >= 0 (freeze_step), read by resolve_optimizer
  kWideString,   // an optimizer-wide string (comm_backend_name), read by resolve_optimizer
  kWideNumber,   // an optimizer-wide number (coeff_beta...), read by resolve_optimizer
  kNsMethod,     // Muon's ns_method: "gram" or "standard", a text in the group
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
  // DeepSpeed's OnebitAdam keyword arguments; bias_correction and eps_inside_sqrt are stored
  // but never read by its update, as in DeepSpeed.
  static const std::vector<KeyRule> onebit_adam = {
      {"lr", Rule::kNumber},
      {"freeze_step", Rule::kWideCount},
      {"bias_correction", Rule::kFlag},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"eps_inside_sqrt", Rule::kWideFlag},
      {"weight_decay", Rule::kNumber},
      {"amsgrad", Rule::kMustBeFalse, Avail::kAlways,
       "1-bit Adam does not support the AMSGrad variant"},
      {"cuda_aware", Rule::kWideFlag},
      {"comm_backend_name", Rule::kWideString},
  };
  // DeepSpeed's ZeroOneAdam keyword arguments.
  static const std::vector<KeyRule> zero_one_adam = {
      {"lr", Rule::kNumber},
      {"bias_correction", Rule::kFlag},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"eps_inside_sqrt", Rule::kWideFlag},
      {"weight_decay", Rule::kNumber},
      {"var_freeze_step", Rule::kWideCount},
      {"var_update_scaler", Rule::kWideCount},
      {"local_step_scaler", Rule::kWideCount},
      {"local_step_clipper", Rule::kWideCount},
      {"amsgrad", Rule::kMustBeFalse, Avail::kAlways,
       "0/1 Adam does not support the AMSGrad variant"},
      {"cuda_aware", Rule::kWideFlag},
      {"comm_backend_name", Rule::kWideString},
  };
  // DeepSpeed's OnebitLamb keyword arguments.
  static const std::vector<KeyRule> onebit_lamb = {
      {"lr", Rule::kNumber},
      {"freeze_step", Rule::kWideCount},
      {"bias_correction", Rule::kFlag},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"eps_inside_sqrt", Rule::kWideFlag},
      {"weight_decay", Rule::kNumber},
      {"max_coeff", Rule::kNumber},
      {"min_coeff", Rule::kNumber},
      {"amsgrad", Rule::kMustBeFalse, Avail::kAlways,
       "1-bit Lamb does not support the AMSGrad variant"},
      {"cuda_aware", Rule::kWideFlag},
      {"comm_backend_name", Rule::kWideString},
      {"coeff_beta", Rule::kWideNumber},
      {"factor_max", Rule::kWideNumber},
      {"factor_min", Rule::kWideNumber},
      {"factor_threshold", Rule::kWideNumber},
  };
  // DeepSpeed's Muon keys (engine._muon_param_groups): the halves' shared keys, the per-half
  // learning rates, and the optimizer-wide choices of its Adam half and of per-head Muon.
  static const std::vector<KeyRule> muon = {
      {"lr", Rule::kNumber},
      {"momentum", Rule::kNumber},
      {"weight_decay", Rule::kNumber},
      {"ns_method", Rule::kNsMethod},
      {"muon_lr", Rule::kWideNumber},
      {"adam_lr", Rule::kWideNumber},
      {"betas", Rule::kPair},
      {"eps", Rule::kNumber},
      {"adam_w_mode", Rule::kWideFlag},
      {"torch_adam", Rule::kMustBeFalse, Avail::kAlways,
       "Muon's Adam half is DeepSpeed's Adam here (torch.optim.AdamW's is not built for it)",
       true},
      {"per_head_muon", Rule::kMustBeFalse, Avail::kAlways,
       "per-head Newton-Schulz (attention heads found from a Hugging Face config) is not "
       "supported yet",
       true},
  };
  switch (spec.kind) {
    case OptimizerKind::kMuon: return muon;
    case OptimizerKind::kOneBitLamb: return onebit_lamb;
    case OptimizerKind::kOneBitAdam: return onebit_adam;
    case OptimizerKind::kZeroOneAdam: return zero_one_adam;
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

int64_t count(const json& v, const std::string& where) {
  refuse_auto(v, where, "an integer >= 0");
  DS_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0, ConfigError, where, " is ", v.dump(),
           "; expected an integer >= 0");
  return v.get<int64_t>();
}

// DeepSpeed's comm_backend_name values; each runs deepspeed::comm's collectives here.
std::string backend_name(const json& v, const std::string& where) {
  refuse_auto(v, where, "a backend name");
  const std::string name = v.is_string() ? v.get<std::string>() : std::string();
  DS_CHECK(name == "nccl" || name == "mpi" || name == "hccl" || name == "compressed", ConfigError,
           where, " is ", v.dump(), "; expected \"nccl\", \"mpi\", \"hccl\" or \"compressed\"");
  return name;
}

std::string ns_method(const json& v, const std::string& where) {
  refuse_auto(v, where, "\"gram\" or \"standard\"");
  DS_CHECK(v.is_string(), ConfigError, where, " is ", v.dump(), "; expected \"gram\" or "
           "\"standard\"");
  return ns_method_name(parse_ns_method(v.get<std::string>(), where));
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
      case Rule::kNsMethod: group.set(key, ns_method(v, where)); break;
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
      case Rule::kWideCount:
      case Rule::kWideString:
      case Rule::kWideNumber:
        DS_CHECK(!in_param_group, ConfigError, where,
                 " applies to the whole optimizer; set it in optimizer.params, not in a param "
                 "group");
        if (rule->rule == Rule::kWideFlag) boolean(v, where);
        if (rule->rule == Rule::kWideCount) count(v, where);
        if (rule->rule == Rule::kWideString) backend_name(v, where);
        if (rule->rule == Rule::kWideNumber) number(v, where);
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
  if (name == "onebitadam") return OptimizerKind::kOneBitAdam;
  if (name == "zerooneadam") return OptimizerKind::kZeroOneAdam;
  if (name == "onebitlamb") return OptimizerKind::kOneBitLamb;
  DS_CHECK(name != "muadam" && name != "muadamw" && name != "musgd", NotSupportedError, head,
           " is not supported yet (muP optimizers from the mup package; ", supported, ")");
  if (name == "muon") return OptimizerKind::kMuon;
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
    case OptimizerKind::kMuon: {
      // Validation only: each half is resolved by resolve_muon_half. lr is the Muon half's.
      GroupOptions g = MuonOptions{}.group();
      const GroupOptions adam = MuonAdamOptions{}.group();
      g.set("betas", adam.pair("betas")).set("eps", adam.number("eps"));
      return g;
    }
    case OptimizerKind::kOneBitLamb: {
      // OnebitLamb's defaults dict, in its order.
      GroupOptions g;
      g.set("lr", 1e-3).set("bias_correction", true).set("betas", std::make_pair(0.9, 0.999));
      g.set("eps", 1e-8).set("weight_decay", 0.0).set("max_grad_norm", 0.0);
      g.set("max_coeff", 10.0).set("min_coeff", 0.01);
      return g;
    }
    case OptimizerKind::kOneBitAdam:
    case OptimizerKind::kZeroOneAdam: {
      // OnebitAdam's and ZeroOneAdam's defaults dict, in its order.
      GroupOptions g;
      g.set("lr", 1e-3).set("bias_correction", true).set("betas", std::make_pair(0.9, 0.999));
      g.set("eps", 1e-8).set("weight_decay", 0.0).set("max_grad_norm", 0.0);
      return g;
    }
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
  if (spec.kind == OptimizerKind::kMuon) spec.adam_w_mode = wide_flag("adam_w_mode", true);
  if (spec.kind == OptimizerKind::kOneBitAdam || spec.kind == OptimizerKind::kZeroOneAdam ||
      spec.kind == OptimizerKind::kOneBitLamb) {
    auto wide = [&](const char* key) -> const json* {
      auto it = params.find(key);
      return it == params.end() || is_unset(*it) ? nullptr : &*it;
    };
    auto read_count = [&](const char* key, int64_t& field) {
      if (auto* v = wide(key)) field = count(*v, base + key);
    };
    read_count("freeze_step", spec.onebit.freeze_step);
    read_count("var_freeze_step", spec.onebit.var_freeze_step);
    read_count("var_update_scaler", spec.onebit.var_update_scaler);
    read_count("local_step_scaler", spec.onebit.local_step_scaler);
    read_count("local_step_clipper", spec.onebit.local_step_clipper);
    DS_CHECK(spec.onebit.local_step_clipper >= 1, ConfigError, base,
             "local_step_clipper is 0; expected an integer >= 1 (the largest local-step interval)");
    auto read_number = [&](const char* key, double& field) {
      if (auto* v = wide(key)) field = number(*v, base + key);
    };
    read_number("coeff_beta", spec.onebit.coeff_beta);
    read_number("factor_max", spec.onebit.factor_max);
    read_number("factor_min", spec.onebit.factor_min);
    read_number("factor_threshold", spec.onebit.factor_threshold);
    DS_CHECK(spec.onebit.factor_min <= spec.onebit.factor_max, ConfigError, base,
             "factor_min (", spec.onebit.factor_min, ") > factor_max (", spec.onebit.factor_max,
             "); expected factor_min <= factor_max");
    spec.onebit.cuda_aware = wide_flag("cuda_aware", false);
    if (auto* v = wide("comm_backend_name")) {
      spec.onebit.comm_backend_name = backend_name(*v, base + "comm_backend_name");
    }
  }
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

GroupOptions resolve_muon_half(const OptimizerConfig& config, bool use_muon,
                               const json& overrides, const std::string& where) {
  static const std::vector<std::string> muon_keys = {"lr", "momentum", "weight_decay",
                                                     "ns_method"};
  static const std::vector<std::string> adam_keys = {"lr", "betas", "eps", "weight_decay"};
  const auto& keys = use_muon ? muon_keys : adam_keys;
  OptimizerSpec spec = resolve_optimizer(config, where, std::nullopt);
  DS_INTERNAL_ASSERT(spec.kind == OptimizerKind::kMuon, "resolve_muon_half: not a Muon config");
  const json& params = config.params.is_null() ? json::object() : config.params;
  GroupOptions half = use_muon ? MuonOptions{}.group() : MuonAdamOptions{}.group();
  // resolve_optimizer checked every value: copy the half's keys from its merged defaults.
  for (const auto& key : keys) {
    auto it = params.find(key);
    if (it == params.end() || is_unset(*it)) continue;
    if (key == "betas") {
      half.set(key, spec.defaults.pair(key));
    } else if (key == "ns_method") {
      half.set(key, spec.defaults.text(key));
    } else {
      half.set(key, spec.defaults.number(key));
    }
  }
  const char* lr_key = use_muon ? "muon_lr" : "adam_lr";
  if (auto it = params.find(lr_key); it != params.end() && !is_unset(*it)) {
    half.set("lr", number(*it, where + ": optimizer.params." + lr_key));
  }
  if (overrides.is_null()) return half;
  DS_CHECK(overrides.is_object(), ConfigError, where, "the options are ", overrides.dump(),
           "; expected an object of optimizer parameters");
  for (auto it = overrides.begin(); it != overrides.end(); ++it) {
    const std::string& key = it.key();
    const json& v = it.value();
    if (key == "use_muon" || key == "name" || is_unset(v)) continue;  // read by the caller
    const bool muon_key = std::find(muon_keys.begin(), muon_keys.end(), key) != muon_keys.end();
    const bool adam_key = std::find(adam_keys.begin(), adam_keys.end(), key) != adam_keys.end();
    DS_CHECK(muon_key || adam_key, ConfigError, where, key,
             " is not a param-group key of Muon (known: lr, momentum, weight_decay, ns_method "
             "for its Muon half; lr, betas, eps, weight_decay for its Adam half; use_muon, "
             "name)");
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;  // the other half's
    if (key == "betas") {
      half.set(key, number_pair(v, where + key));
    } else if (key == "ns_method") {
      half.set(key, ns_method(v, where + key));
    } else {
      half.set(key, number(v, where + key));
    }
  }
  check_values(spec, half, where);
  return half;
}

}  // namespace deepspeed::optim

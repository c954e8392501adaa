// ds_config's optimizer section resolved DeepSpeed's way (reference §3.1): which optimizer class
// `type` selects, the keyword arguments that class accepts (with DeepSpeed's and torch.optim's
// defaults), and each param group's hyper-parameters. The optimizer factory builds from this.
#pragma once

#include <optional>
#include <string>

#include "deepspeed/config.h"
#include "deepspeed/onebit.h"
#include "deepspeed/optimizers.h"

namespace deepspeed::optim {

enum class OptimizerKind {
  kAdam, kLamb, kLion, kAdagrad, kSGD, kOneBitAdam, kZeroOneAdam, kOneBitLamb, kMuon
};

/// The optimizer a config section asks for.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kAdam;
  std::string type;              // optimizer.type as written, for messages
  bool adam_w_mode = true;       // Adam: decoupled weight decay ("Adam" unless adam_w_mode false)
  bool torch_adam = false;       // Adam: torch.optim.Adam/AdamW instead of DeepSpeed's
  bool eps_inside_sqrt = false;  // Lamb
  onebit::OneBitSettings onebit;  // OneBitAdam, ZeroOneAdam, OneBitLamb: optimizer-wide params
  /// Muon: its Adam half's decoupled weight decay (adam_w_mode, default true) is adam_w_mode
  /// above; the two halves' hyper-parameters are muon_group() / muon_adam_group().
  /// The hyper-parameters of a group without overrides: defaults overridden by optimizer.params.
  GroupOptions defaults;
};

/// Resolves `config` (type and params). `offload` is whether offload_optimizer is on, which
/// selects DeepSpeed's CPU optimizers and so the parameters they accept; nullopt (config-time
/// check, before the ZeRO section is applied) accepts the parameters of either.
/// Throws ConfigError for an unknown type or parameter (naming it and listing the known ones),
/// a bad value or max_grad_norm; NotSupportedError for a known type or setting not built here.
OptimizerSpec resolve_optimizer(const OptimizerConfig& config, const std::string& source,
                                std::optional<bool> offload);

/// The hyper-parameters of one param group: spec.defaults overridden by `overrides` (a
/// ParamGroup's json; null means none), checked like optimizer.params; `where` names the
/// group in messages.
/// Optimizer-wide settings (adam_w_mode, torch_adam, eps_inside_sqrt) are refused there.
GroupOptions resolve_group_options(const OptimizerSpec& spec, const json& overrides,
                                   const std::string& where, std::optional<bool> offload);

/// Muon (MuonWithAuxAdam): the hyper-parameters of one half of a param group, as DeepSpeed's
/// _muon_param_groups resolves them: the half's defaults (MuonOptions / MuonAdamOptions), then
/// optimizer.params' shared keys of that half (Muon: lr, momentum, weight_decay, ns_method;
/// Adam: lr, betas, eps, weight_decay), then muon_lr / adam_lr, then the group's `overrides`
/// (the same keys, plus "use_muon" and "name", which the caller reads). ConfigError names a key
/// the group may not set or a bad value.
GroupOptions resolve_muon_half(const OptimizerConfig& config, bool use_muon,
                               const json& overrides, const std::string& where);

}  // namespace deepspeed::optim

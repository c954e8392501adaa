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

enum class OptimizerKind { kAdam, kLamb, kLion, kAdagrad, kSGD, kOneBitAdam, kZeroOneAdam, kOneBitLamb };

/// The optimizer a config section asks for.
struct OptimizerSpec {
  OptimizerKind kind = OptimizerKind::kAdam;
  std::string type;              // optimizer.type as written, for messages
  bool adam_w_mode = true;       // Adam: decoupled weight decay ("Adam" unless adam_w_mode false)
  bool torch_adam = false;       // Adam: torch.optim.Adam/AdamW instead of DeepSpeed's
  bool eps_inside_sqrt = false;  // Lamb
  onebit::OneBitSettings onebit;  // OneBitAdam, ZeroOneAdam, OneBitLamb: optimizer-wide params
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

}  // namespace deepspeed::optim

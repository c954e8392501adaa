// torch_autocast's set-up in the engine (DeepSpeed's init_autocast_params): the dtype for this
// device, and the parameters of the lower-precision-safe modules, whose gradients (and, under
// ZeRO-3, gathered shards) then travel in that dtype.
#pragma once

#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include "deepspeed/config.h"
#include "runtime/zero/comm_dtypes.h"

namespace deepspeed::runtime {

/// DeepSpeed's default lower_precision_safe_modules.
const std::vector<std::string>& default_lower_precision_safe_modules();

/// torch_autocast.dtype, or torch.autocast's default for `device` when unset. Throws
/// ConfigError naming torch_autocast.dtype when this LibTorch has no such autocast there.
at::ScalarType torch_autocast_dtype(const DeepSpeedConfig& config, c10::DeviceType device);

/// Whether `configured` (a lower_precision_safe_modules entry) names the module class whose
/// Module::name() is `type_name`. Entries are DeepSpeed's "package.Class" or C++'s
/// "ns::Class": torch.nn's classes in any spelling ("torch.nn.Linear",
/// "torch.nn.modules.linear.Linear") name LibTorch's (torch::nn::LinearImpl); other entries
/// name the class with that qualified name, "Impl" suffix optional.
bool names_module_class(const std::string& configured, const std::string& type_name);

/// The parameters of `model`'s modules whose class torch_autocast.lower_precision_safe_modules
/// names (the module's own parameters, not its children's), each with `dtype`. Without the key,
/// DeepSpeed's default list; an empty list marks none. An entry that names no module of the
/// model is reported in `unmatched` (the default list's are not).
CommDtypes autocast_comm_dtypes(torch::nn::Module& model, const DeepSpeedConfig& config,
                                at::ScalarType dtype, std::vector<std::string>* unmatched);

}  // namespace deepspeed::runtime

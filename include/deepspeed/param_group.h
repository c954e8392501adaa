// ParamGroup: DeepSpeed's `model_parameters` given as param-group dicts. Each group lists its
// parameters and overrides of the optimizer's parameters for that group (e.g. no weight decay on
// biases and norms): {"weight_decay": 0.0}. Keys follow the ds_config optimizer.params names.
#pragma once

#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace deepspeed {

struct ParamGroup {
  ParamGroup() = default;
  // Not an aggregate, so that {params}, {params, options} and {params, options, mask} all work
  // without missing-initializer warnings.
  ParamGroup(std::vector<at::Tensor> params_, nlohmann::json options_ = nlohmann::json::object(),
             at::Tensor exp_avg_mask_ = at::Tensor())
      : params(std::move(params_)), options(std::move(options_)),
        exp_avg_mask(std::move(exp_avg_mask_)) {}

  std::vector<at::Tensor> params;
  nlohmann::json options = nlohmann::json::object();
  /// DeepSpeed's 'exp_avg_mask' key (OneBitAdam, ZeroOneAdam, OneBitLamb only; a ConfigError
  /// with another optimizer): multiplied into the momentum of each of the group's parameters
  /// after every compressed all-reduce, so that masked elements keep a zero momentum (see
  /// onebit::CompressedCommunication::set_exp_avg_mask). Its numel must equal every parameter's
  /// of the group (give a masked parameter a group of its own, as DeepSpeed's BERT example
  /// does); the parameter's shape or a flattened copy both work. Undefined: no mask.
  at::Tensor exp_avg_mask;
};

}  // namespace deepspeed

// ParamGroup: DeepSpeed's `model_parameters` given as param-group dicts. Each group lists its
// parameters and overrides of the optimizer's parameters for that group (e.g. no weight decay on
// biases and norms): {"weight_decay": 0.0}. Keys follow the ds_config optimizer.params names.
#pragma once

#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

namespace deepspeed {

struct ParamGroup {
  std::vector<at::Tensor> params;
  nlohmann::json options = nlohmann::json::object();
};

}  // namespace deepspeed

// Removing a registered parameter, buffer or child from a torch::nn::Module: Python's
// `del module.name`, which LibTorch offers for children only. DeepSpeed's redundancy_clean
// deletes the masks and scores compression registered; these let ours do the same, so that
// the cleaned model's state dict is DeepSpeed's.
#pragma once

#include <string>

#include <torch/nn/module.h>

namespace deepspeed::nn {

/// Each returns whether `name` was registered (and is now removed) on `module` itself.
bool erase_parameter(torch::nn::Module& module, const std::string& name);
bool erase_buffer(torch::nn::Module& module, const std::string& name);
bool erase_child(torch::nn::Module& module, const std::string& name);

}  // namespace deepspeed::nn

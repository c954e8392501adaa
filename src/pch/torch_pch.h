// The LibTorch headers every deepspeed-cpp target needs, compiled once (see ds_use_torch_pch).
#pragma once

#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <nlohmann/json.hpp>

// What the Muon optimizer (deepspeed::optim::Muon) runs with, checked when the engine is built.
// Newton-Schulz needs each matrix whole: ZeRO 1/2 and 3 gather a Muon group's gradients for it
// (zero/muon_orthogonalizer.h, zero/stage3_muon.h); the rest is refused by name until it does
// the same.
#pragma once

#include <torch/optim/optimizer.h>

#include "deepspeed/config.h"

namespace deepspeed::runtime {

struct MuonSetting {
  int model_parallel_size = 1;  // the mpu's tensor-parallel size, or AutoTP's
};

/// Throws NotSupportedError naming the setting when `optimizer` is a Muon and the engine would
/// run it with NVMe optimizer offload at stage 3 or tensor parallelism (sharded matrices). Does
/// nothing for other optimizers.
void check_muon_combinations(const torch::optim::Optimizer& optimizer,
                             const DeepSpeedConfig& config, const MuonSetting& setting);

}  // namespace deepspeed::runtime

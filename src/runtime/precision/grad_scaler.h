// torch.amp.GradScaler's scale schedule, which DeepSpeed uses for torch_autocast with fp16
// instead of its own DynamicLossScaler: the scale starts at 2^16, halves on every step whose
// gradients hold an inf or nan (that step is skipped) and doubles after growth_interval clean
// steps in a row. No hysteresis, no floor. DeepSpeed keeps it out of checkpoints, as we do.
#pragma once

#include <cstdint>

#include "runtime/precision/loss_scaler.h"

namespace deepspeed::runtime {

/// torch.amp.GradScaler's constructor arguments and defaults.
struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class TorchGradScaler : public LossScaler {
 public:
  explicit TorchGradScaler(const GradScalerOptions& options = {});

  /// GradScaler.update(): backoff on overflow (the tracker restarts), else the tracker counts
  /// the clean step and at growth_interval the scale grows and the tracker restarts.
  void update_scale(bool overflow) override;
  bool dynamic() const override { return true; }
  int64_t growth_tracker() const { return growth_tracker_; }

 private:
  GradScalerOptions options_;
  int64_t growth_tracker_ = 0;
};

}  // namespace deepspeed::runtime

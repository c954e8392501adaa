// TorchGradScaler (see the header): torch/amp/grad_scaler.py's update(), on the host.
#include "runtime/precision/grad_scaler.h"

namespace deepspeed::runtime {

TorchGradScaler::TorchGradScaler(const GradScalerOptions& options)
    : LossScaler(options.init_scale), options_(options) {}

void TorchGradScaler::update_scale(bool overflow) {
  if (overflow) {
    cur_scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
  } else if (++growth_tracker_ == options_.growth_interval) {
    cur_scale_ *= options_.growth_factor;
    growth_tracker_ = 0;
  }
  cur_iter_ += 1;
}

}  // namespace deepspeed::runtime
